"""The decoding loop reads "every row has finished" on the host only every `check_every` steps.

On an accelerator each such read drains the launch queue, so `sample` must not do it per
token; the steps it runs past the last EOS are cut off, so outputs do not depend on the
cadence. Host syncs are counted as the tensor-to-Python conversions the loop makes
(`bool`, `int`, `float`, `.item()`, `.tolist()`, `nonzero`...), seen through a TorchFunctionMode.
"""

import pytest
import torch
from torch.overrides import TorchFunctionMode
from transformers import Qwen2Config, Qwen2ForCausalLM

from rlhf.rollout.decode import decoded_length, default_check_every, sample

PAD, EOS = 0, 1
SYNCS = {"__bool__", "__int__", "__float__", "__index__", "item", "tolist", "numpy", "nonzero", "masked_select",
         "unique"}


def qwen2():
    torch.manual_seed(0)
    return Qwen2ForCausalLM(Qwen2Config(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)).eval()


def prompts(rows=3):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(2, 50, (rows, 7), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    return ids.masked_fill(mask == 0, PAD), mask


class CountSyncs(TorchFunctionMode):
    """Counts calls that copy a tensor's value to the host (each one waits for the device)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.count += getattr(func, "__name__", "") in SYNCS
        return func(*args, **(kwargs or {}))


def syncs(model, max_new_tokens, check_every, lean=True):
    ids, mask = prompts()
    with CountSyncs() as counter:  # min_new_tokens = max_new_tokens: no row can stop early
        tokens, _ = sample(model, ids, mask, n=2, max_new_tokens=max_new_tokens, eos_token_ids=[EOS],
                           pad_token_id=PAD, temperature=1.0, min_new_tokens=max_new_tokens, lean=lean,
                           check_every=check_every)
    assert tokens.shape == (6, max_new_tokens)
    return counter.count


@pytest.mark.parametrize("lean", [True, False], ids=["lean", "model-forward"])
def test_host_syncs_grow_with_checks_not_with_tokens(lean):
    model = qwen2()
    # 24 steps: 23 checks at one per step; at one per 8 steps 2 checks (steps 8, 16); at step 24 every row has
    # reached the limit, which the host knows without a check
    assert syncs(model, 24, 1, lean) - syncs(model, 24, 8, lean) == 21
    if lean:  # no sync per token at all: 16 more steps cost no sync between checks
        assert syncs(model, 24, 32) - syncs(model, 8, 32) == 0
    # (the model's own forward syncs once per step inside transformers: its SDPA mask check)


def prompts_of_lengths(lengths):
    """Left-padded prompts with these numbers of real tokens."""
    g = torch.Generator().manual_seed(2)
    width = max(lengths)
    ids = torch.randint(2, 50, (len(lengths), width), generator=g)
    mask = torch.zeros_like(ids)
    for i, length in enumerate(lengths):
        mask[i, width - length :] = 1
    return ids.masked_fill(mask == 0, PAD), mask


def finishing_at(model, position):
    """A forward hook: every row emits EOS once it reaches `position` (a row of prompt length L at decoding
    step position - L), decided by the row's own position whichever rows share the call; counts the calls."""
    calls = []

    def hook(module, args, kwargs, out):
        calls.append(1)
        late = kwargs["position_ids"][:, -1] >= position - 1
        out.logits[late, -1, EOS] += 1e4
        return out

    return model.register_forward_hook(hook, with_kwargs=True), calls


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("check_every", [1, 3, 4, 7, 16])
def test_steps_past_the_last_eos_are_fewer_than_the_cadence_and_cut_off(check_every, temperature):
    model = qwen2()
    finish = [2, 9, 5]  # R = 10 decoded steps: the last row's EOS is step 9
    ids, mask = prompts_of_lengths([12 - s for s in finish])
    kwargs = dict(n=1, max_new_tokens=30, eos_token_ids=[EOS], pad_token_id=PAD, temperature=temperature)
    handle, _ = finishing_at(model, 12)
    try:
        torch.manual_seed(3)
        expected = sample(model, ids, mask, check_every=1, **kwargs)
    finally:
        handle.remove()
    handle, calls = finishing_at(model, 12)  # a hook makes the loop call the model's forward: countable
    try:
        torch.manual_seed(3)
        tokens, log_probs = sample(model, ids, mask, check_every=check_every, **kwargs)
    finally:
        handle.remove()
    assert tokens.shape == (3, 10)
    assert torch.equal(tokens, expected[0]) and torch.equal(log_probs, expected[1])
    assert [int(tokens[i, s]) for i, s in enumerate(finish)] == [EOS] * 3
    assert tokens[0, 3:].eq(PAD).all() and log_probs[0, 3:].eq(0).all()
    decoded = len(calls)  # prefill + one forward per step after the first
    assert 10 <= decoded <= 10 + check_every - 1
    assert decoded % check_every == 0 or check_every == 1  # it stopped at a check


def test_sampled_outputs_do_not_depend_on_the_cadence():
    """Lean path, 3 samples per prompt, rows ending at different steps, the last at step 17: a multiple
    of no cadence below, so each one decodes past it (64: to max_new_tokens) and cuts back."""
    model = qwen2()
    ids, mask = prompts()
    kwargs = dict(n=3, max_new_tokens=40, eos_token_ids=[EOS, 7, 12, 20, 33, 41], pad_token_id=PAD)
    outs = []
    for k in (1, 5, 16, 64):
        torch.manual_seed(0)
        outs.append(sample(model, ids, mask, check_every=k, **kwargs))
    assert outs[0][0].shape == (9, 17)
    for tokens, log_probs in outs[1:]:
        assert torch.equal(tokens, outs[0][0]) and torch.equal(log_probs, outs[0][1])


def test_decoded_length_is_the_step_of_the_last_eos():
    eos = torch.tensor([1, 9])
    tokens = torch.tensor([[5, 1, 0, 0, 0, 0], [5, 6, 9, 0, 0, 0], [9, 0, 0, 0, 0, 0]])
    assert decoded_length(tokens, eos, 6) == 3  # row 1 ends with EOS at step 2 (0-based)
    tokens[2] = torch.tensor([4, 4, 4, 4, 4, 4])  # a row that never ended: every decoded step
    assert decoded_length(tokens, eos, 5) == 5


def test_the_default_checks_every_step_on_cpu_only():
    assert default_check_every(torch.device("cpu")) == 1
    assert default_check_every(torch.device("cuda", 0)) == 16
    with pytest.raises(ValueError, match="check_every"):
        ids, mask = prompts()
        sample(qwen2(), ids, mask, n=1, max_new_tokens=2, eos_token_ids=[EOS], pad_token_id=PAD, check_every=-1)
