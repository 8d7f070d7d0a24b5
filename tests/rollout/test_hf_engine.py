"""HFEngine: left-padded batched sampling, n per prompt, EOS masking, engine log-probs."""

import pytest
import torch

from rlhf.batch import Batch
from rlhf.data.tokenize import chat_prompt_ids, left_pad, position_ids
from rlhf.models.loading import load_causal_lm, load_tokenizer
from rlhf.rollout import HFEngine, SamplingParams, response_mask_from_eos
from rlhf.rollout.lean_decoder import LeanDecoder
from helpers import tiny_model_path


@pytest.fixture(scope="module")
def engine():
    path = tiny_model_path()
    return HFEngine(path)


def prompts(tok, texts):
    ids, mask = left_pad([chat_prompt_ids(tok, [{"role": "user", "content": t}]) for t in texts], tok.pad_token_id)
    return Batch({"input_ids": ids, "attention_mask": mask, "position_ids": position_ids(mask)}, {"uid": texts})


def test_response_mask_stops_after_first_eos():
    r = torch.tensor([[5, 9, 7, 9, 1], [1, 2, 3, 4, 5], [9, 0, 0, 0, 0]])
    assert response_mask_from_eos(r, [9]).tolist() == [[1, 1, 0, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]]


def test_n_samples_per_prompt_stay_adjacent_and_shapes_agree(engine):
    torch.manual_seed(0)
    out = engine.generate(prompts(engine.tokenizer, ["What is 1+2?", "Hi"]), SamplingParams(n=3, max_new_tokens=6))
    assert list(out["uid"]) == ["What is 1+2?"] * 3 + ["Hi"] * 3
    b, r = out["responses"].shape
    assert b == 6 and r <= 6
    assert out["input_ids"].shape[1] == out["prompts"].shape[1] + r
    assert torch.equal(out["attention_mask"][:, -r:], out["response_mask"])
    # padding after EOS is the pad token and carries no log-prob
    pad = out["response_mask"] == 0
    assert out["responses"][pad].eq(engine.tokenizer.pad_token_id).all()
    assert out["rollout_log_probs"][pad].eq(0).all()
    assert (out["rollout_log_probs"][~pad] <= 0).all()


def test_greedy_is_deterministic_and_independent_of_left_padding(engine):
    greedy = SamplingParams(temperature=0.0, max_new_tokens=5)
    alone = engine.generate(prompts(engine.tokenizer, ["What is 1+2?"]), greedy)
    padded = engine.generate(prompts(engine.tokenizer, ["What is 1+2?", "a much longer prompt than the first"]), greedy)
    n = int(alone["response_mask"][0].sum())
    assert torch.equal(alone["responses"][0, :n], padded["responses"][0, :n])


def test_engine_log_probs_match_a_forward_pass(engine):
    torch.manual_seed(1)
    sampling = SamplingParams(n=2, temperature=0.7, max_new_tokens=6)
    out = engine.generate(prompts(engine.tokenizer, ["What is 12+30?", "x"]), sampling)
    r = out["responses"].shape[1]
    with torch.no_grad():
        logits = engine.model(
            input_ids=out["input_ids"], attention_mask=out["attention_mask"], position_ids=out["position_ids"]
        ).logits[:, -r - 1 : -1] / 0.7
    ref = torch.log_softmax(logits, -1).gather(-1, out["responses"].unsqueeze(-1)).squeeze(-1)
    mask = out["response_mask"].bool()
    assert torch.allclose(ref[mask], out["rollout_log_probs"][mask], atol=1e-4)


def test_top_k_one_sampling_equals_greedy(engine):
    batch = prompts(engine.tokenizer, ["What is 5+6?", "abc"])
    greedy = engine.generate(batch, SamplingParams(temperature=0.0, max_new_tokens=6))
    torch.manual_seed(3)
    top1 = engine.generate(batch, SamplingParams(temperature=1.3, top_k=1, max_new_tokens=6))
    assert torch.equal(greedy["responses"], top1["responses"])


def test_sampling_is_not_silently_truncated_to_top_50(engine):
    """transformers defaults top_k to 50; top_k=0 must reach generate as 'no truncation'."""
    torch.manual_seed(0)
    batch = prompts(engine.tokenizer, ["x"])
    out = engine.generate(batch, SamplingParams(n=64, temperature=5.0, max_new_tokens=1))
    first = out["responses"][:, 0]
    with torch.no_grad():
        logits = engine.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[0, -1]
    ranks = (logits.argsort(descending=True).argsort())[first]
    assert int(ranks.max()) >= 50  # at T=5 over 259 tokens, 64 draws reach beyond the top 50


TEXTS = ["What is 12+30?", "x", "a much longer prompt than the others, to force left padding", "Hi there", "7*8=?"]


@pytest.fixture
def eos_at_position_40(engine):
    """EOS becomes the greedy choice once a row's position reaches 40: rows (prompts of 20 to 78 tokens) end
    at different steps, decided by their own content, whichever rows share a call. Decodes through the
    model's forward (a hook), which is what this checks: chunking, not the step."""
    eos = engine.eos_token_ids[0]

    def hook(module, args, kwargs, out):
        late = kwargs["position_ids"][:, -1] >= 40
        out.logits[late, -1, eos] += 1e4
        return out

    handle = engine.model.register_forward_hook(hook, with_kwargs=True)
    yield
    handle.remove()


@pytest.mark.parametrize("max_rows", [1, 4, 6, 100])
def test_chunked_greedy_generation_equals_one_call(engine, eos_at_position_40, max_rows):
    batch = prompts(engine.tokenizer, TEXTS)
    greedy = SamplingParams(n=2, temperature=0.0, max_new_tokens=24)
    whole = engine.generate(batch, greedy)
    chunked = HFEngine.sharing(engine.model, engine.tokenizer, max_rows_per_call=max_rows).generate(batch, greedy)
    lengths = whole["response_mask"].sum(dim=1)
    assert len(set(lengths.tolist())) >= 3  # rows end at different steps, so chunks differ in length
    assert list(chunked["uid"]) == list(whole["uid"])
    for key in ("responses", "response_mask", "input_ids", "attention_mask", "position_ids"):
        assert torch.equal(chunked[key], whole[key]), key
    assert torch.allclose(chunked["rollout_log_probs"], whole["rollout_log_probs"], atol=1e-5)


def test_chunks_hold_whole_prompt_groups_and_at_most_max_rows(engine):
    rows = []
    handle = engine.model.register_forward_pre_hook(lambda m, a, kw: rows.append(kw["input_ids"].shape), with_kwargs=True)
    try:
        chunked = HFEngine.sharing(engine.model, engine.tokenizer, max_rows_per_call=7)
        torch.manual_seed(0)
        out = chunked.generate(prompts(engine.tokenizer, TEXTS), SamplingParams(n=3, max_new_tokens=3))
    finally:
        handle.remove()
    prefills = [r[0] for r in rows if r[1] > 1]  # prompt passes: U prompts, then steps of U*n rows
    assert prefills == [2, 2, 1]  # 7 // 3 = 2 prompts (6 rows) per call
    assert max(r[0] for r in rows) <= 7
    assert out["responses"].shape[0] == 15 and list(out["uid"]) == [t for t in TEXTS for _ in range(3)]


def test_the_kv_cache_holds_max_rows_of_the_longest_prompt_plus_the_allowed_new_tokens(engine, monkeypatch):
    """One KV cache per call: decoded tokens (rows, kv_heads, max_new_tokens, D) and prompts (rows, kv_heads, P, D),
    rows = the whole prompt groups that fit in max_rows_per_call (all rows without it), P the call's longest
    prompt, each prompt kept once for its n samples; finished rows free their slots."""
    import rlhf.rollout.decode as decode

    shapes = []

    def spy(*args, **kwargs):
        decoder = LeanDecoder(*args, **kwargs)
        shapes.append((tuple(decoder.keys[0].shape), tuple(decoder.prompt_keys[0].shape)))
        return decoder

    monkeypatch.setattr(decode, "LeanDecoder", spy)
    batch = prompts(engine.tokenizer, TEXTS)
    longest = int(batch["attention_mask"].sum(dim=1).max())  # 78 tokens
    greedy = SamplingParams(n=2, temperature=0.0, max_new_tokens=5)
    whole = engine.generate(batch, greedy)
    capped = HFEngine.sharing(engine.model, engine.tokenizer, max_rows_per_call=5).generate(batch, greedy)
    cfg = engine.model.config
    kv, d = cfg.num_key_value_heads, cfg.hidden_size // cfg.num_attention_heads
    assert shapes == [((10, kv, 5, d), (10, kv, longest, d)), ((4, kv, 5, d), (4, kv, longest, d))]  # 5 rows: 2 groups
    assert torch.equal(capped["responses"], whole["responses"])
    assert torch.allclose(capped["rollout_log_probs"], whole["rollout_log_probs"], atol=1e-5)


def test_max_rows_per_call_is_validated(engine):
    with pytest.raises(ValueError, match="max_rows_per_call"):
        HFEngine.sharing(engine.model, engine.tokenizer, max_rows_per_call=0)
