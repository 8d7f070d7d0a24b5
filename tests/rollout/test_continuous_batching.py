"""Continuous batching in rlhf.rollout.decode: finished rows leave the batch, pending prompts take their slots.

The static batch (continuous=False, one wave) is the reference: the same greedy tokens whatever the
row cap and the check cadence, and the same log-probs (bit for bit when every row decodes in one wave;
within float rounding when prompts are prefilled in smaller groups, whose padding differs); the same
samples from a seed in one wave; log-probs that match a forward pass over the sampled text when rows
are admitted mid-decoding. And the work: rows that finished are no longer decoded, and no more rows
decode at once than the cap allows.
"""

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

import rlhf.rollout.decode as decode
from rlhf.rollout.decode import sample
from rlhf.rollout.lean_decoder import LeanDecoder

PAD, EOS = 0, 1
LENGTHS = [9, 3, 6, 8, 5, 7]  # prompt lengths (left-padded to 9)


def eos_prone():
    """A random untied Qwen2 whose EOS logit is scaled 2.5x: greedy rows end at different steps
    ([4, 27, 3, 1, 40+] for the first five prompts), decided by each row's own content."""
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2,
                                         tie_word_embeddings=False)).eval()
    with torch.no_grad():
        model.lm_head.weight[EOS] *= 2.5
    return model


def prompts(lengths=LENGTHS):
    g = torch.Generator().manual_seed(1)
    width = max(lengths)
    ids = torch.randint(2, 50, (len(lengths), width), generator=g)
    mask = torch.zeros_like(ids)
    for i, length in enumerate(lengths):
        mask[i, width - length :] = 1
    return ids.masked_fill(mask == 0, PAD), mask


def run(model, *, n=2, max_new_tokens=40, temperature=0.0, seed=0, **options):
    ids, mask = prompts()
    torch.manual_seed(seed)
    return sample(model, ids, mask, n=n, max_new_tokens=max_new_tokens, eos_token_ids=[EOS], pad_token_id=PAD,
                  temperature=temperature, **options)


def hooked(model):
    """The same model decoding through its own forward (a forward hook rules the lean step out)."""
    model.register_forward_hook(lambda module, args, out: out)
    return model


def lengths_of(tokens):
    is_eos = tokens == EOS
    return torch.where(is_eos.any(dim=1), is_eos.int().argmax(dim=1) + 1, tokens.shape[1]).tolist()


@pytest.mark.parametrize("build", [eos_prone, lambda: hooked(eos_prone())], ids=["lean", "model-forward"])
@pytest.mark.parametrize("max_rows", [None, 4, 6, 9])
@pytest.mark.parametrize("check_every", [1, 5])
def test_greedy_tokens_and_log_probs_equal_the_static_batch_bit_for_bit(build, max_rows, check_every):
    model = build()
    static = run(model, continuous=False)
    tokens, log_probs = run(model, max_rows=max_rows, check_every=check_every)
    lengths = lengths_of(static[0])
    assert len(set(lengths)) >= 4 and max(lengths) == 40  # rows end at different steps, one at the limit
    assert torch.equal(tokens, static[0])
    if max_rows is None:  # one prefill over every prompt, as the static batch's: the same bits
        assert torch.equal(log_probs, static[1])
    else:  # prompts prefilled in groups of their own (other padding columns): float rounding
        assert torch.allclose(log_probs, static[1], atol=1e-5)


@pytest.mark.parametrize("check_every", [1, 3, 64])
def test_sampled_rows_from_a_seed_equal_the_static_batch_when_all_decode_at_once(check_every):
    model = eos_prone()
    static = run(model, temperature=1.0, n=3, seed=7, continuous=False)
    tokens, log_probs = run(model, temperature=1.0, n=3, seed=7, check_every=check_every)
    assert len(set(lengths_of(static[0]))) >= 4
    assert torch.equal(tokens, static[0]) and torch.equal(log_probs, static[1])


@pytest.mark.parametrize("max_rows", [4, 5])
def test_rows_admitted_mid_decoding_get_the_log_probs_of_a_forward_pass(max_rows):
    """Sampled rows admitted into freed slots (their prefill and KV cache placed among older rows) carry the
    log-prob a plain forward pass over prompt + response gives each sampled token (T = 0.8)."""
    model = eos_prone()
    ids, mask = prompts()
    tokens, log_probs = run(model, temperature=0.8, n=2, seed=3, max_new_tokens=25, max_rows=max_rows,
                            logprob_temperature=0.8)
    rows = tokens.shape[0]
    full_ids = torch.cat([ids.repeat_interleave(2, 0), tokens], dim=1)
    is_eos = tokens == EOS
    response_mask = (torch.cumsum(is_eos.int(), dim=1) - is_eos.int()) == 0
    full_mask = torch.cat([mask.repeat_interleave(2, 0), response_mask.long()], dim=1)
    with torch.no_grad():
        logits = model(input_ids=full_ids, attention_mask=full_mask,
                       position_ids=(full_mask.cumsum(1) - 1).clamp(min=0)).logits[:, -tokens.shape[1] - 1 : -1]
    ref = torch.log_softmax(logits.float() / 0.8, -1).gather(-1, tokens[..., None]).squeeze(-1)
    assert rows == 12 and len(set(lengths_of(tokens))) >= 4
    assert torch.allclose(ref[response_mask], log_probs[response_mask], atol=1e-5)
    assert log_probs[~response_mask].eq(0).all() and tokens[~response_mask].eq(PAD).all()


class Spy:
    """Records the rows of every lean decoding step and every prefill, and the rows decoding at each admission."""

    def __init__(self, monkeypatch):
        self.steps, self.prefills, self.decoding_at_admission = [], [], []
        prefill, spy = decode._prefill, self

        class Decoder(LeanDecoder):
            def step(self, token):
                spy.steps.append(token.shape[0])
                return super().step(token)

            def add(self, cache, mask, n):
                spy.decoding_at_admission.append(self.rows)
                return super().add(cache, mask, n)

        def counted_prefill(model, ids, mask):
            spy.prefills.append(ids.shape[0])
            return prefill(model, ids, mask)

        monkeypatch.setattr(decode, "LeanDecoder", Decoder)
        monkeypatch.setattr(decode, "_prefill", counted_prefill)


def test_finished_rows_stop_being_decoded(monkeypatch):
    model = eos_prone()
    spy = Spy(monkeypatch)
    tokens, _ = run(model, continuous=False)
    static_work = sum(spy.steps)
    spy.steps.clear()
    tokens, _ = run(model)
    lengths = lengths_of(tokens)
    assert static_work == 12 * 39  # 12 rows x (40 tokens - the first, which comes from the prefill)
    assert spy.steps == sorted(spy.steps, reverse=True) and spy.steps[0] == 12 - lengths.count(1)
    # a row of L tokens is fed L - 1 times; rows stay while fewer than 4 are left (see BATCH_INVARIANT_ROWS)
    assert sum(length - 1 for length in lengths) <= sum(spy.steps) <= sum(length - 1 for length in lengths) + 3 * 39
    assert sum(spy.steps) < static_work / 2


def test_pending_prompts_take_the_slots_of_finished_rows(monkeypatch):
    model = eos_prone()
    spy = Spy(monkeypatch)
    tokens, _ = run(model, max_rows=4)  # 2 prompts (4 rows) at once, 6 prompts
    assert max(spy.steps) <= 4 and sum(spy.prefills) == 6 and spy.prefills[0] == 2
    # every later prompt joined rows that were still decoding (the 27-token row of prompt 1 among them)
    assert spy.decoding_at_admission[0] == 0 and all(rows > 0 for rows in spy.decoding_at_admission[1:])
    refilled_work = sum(spy.steps)
    spy.steps.clear(), spy.prefills.clear(), spy.decoding_at_admission.clear()
    run(model, max_rows=4, continuous=False)  # static waves of 2 prompts: each waits for its slowest row
    assert spy.prefills == [2, 2, 2] and spy.decoding_at_admission == [0, 0, 0]
    assert refilled_work < 0.6 * sum(spy.steps)  # row-steps: 142 against 268
    assert torch.equal(tokens, run(model, continuous=False)[0])


def test_the_models_forward_keeps_four_rows_and_drops_the_rest(monkeypatch):
    """Through the model's own forward a finished row's cache is dropped too (DynamicCache rows), but the batch
    never goes below 4 rows (BATCH_INVARIANT_ROWS), so each row's arithmetic is that of the static batch."""
    model = hooked(eos_prone())
    sizes = []
    model.register_forward_pre_hook(lambda m, args, kwargs: sizes.append(kwargs["input_ids"].shape[0]),
                                    with_kwargs=True)
    lengths = lengths_of(run(model)[0])
    steps = sizes[1:]  # after the prefill (6 prompts)
    assert sizes[0] == 6 and steps[0] == 12 - lengths.count(1)  # rows that ended with their first token left
    assert steps == sorted(steps, reverse=True) and min(steps) == 4


def test_max_rows_is_validated():
    with pytest.raises(ValueError, match="max_rows"):
        run(eos_prone(), max_rows=0)


def test_no_prompts_give_no_responses():
    ids, mask = prompts()
    tokens, log_probs = sample(eos_prone(), ids[:0], mask[:0], n=2, max_new_tokens=5, eos_token_ids=[EOS],
                               pad_token_id=PAD)
    assert tokens.shape == (0, 0) and log_probs.shape == (0, 0)
