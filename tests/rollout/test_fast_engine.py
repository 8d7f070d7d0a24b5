"""The HF engine's own decoding loop (rlhf.rollout.decode) against transformers' `generate`.

Same greedy tokens, same engine log-probs, same sampling distribution (temperature, top-k,
top-p), shared prefill of the n samples of a prompt, padding after EOS and early stop.
"""

import math

import pytest
import torch
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from rlhf.batch import Batch
from rlhf.data.tokenize import chat_prompt_ids, left_pad, position_ids
from rlhf.models.loading import load_causal_lm, load_tokenizer
from rlhf.rollout import HFEngine, SamplingParams
from rlhf.rollout.decode import draw, sample, warp_logits
from helpers import tiny_model_path

TEXTS = ["What is 12+30?", "x", "a much longer prompt than the others, to force left padding", "Hi there"]


@pytest.fixture(scope="module")
def engines():
    path = tiny_model_path()
    model, tok = load_causal_lm(path).eval(), load_tokenizer(path)
    return HFEngine.sharing(model, tok), HFEngine.sharing(model, tok, use_generate=True)


def prompts(tok, texts):
    ids, mask = left_pad([chat_prompt_ids(tok, [{"role": "user", "content": t}]) for t in texts], tok.pad_token_id)
    return Batch({"input_ids": ids, "attention_mask": mask, "position_ids": position_ids(mask)}, {"uid": list(texts)})


@pytest.mark.parametrize("n", [1, 3])
def test_greedy_tokens_and_log_probs_equal_generate(engines, n):
    fast, reference = engines
    batch = prompts(fast.tokenizer, TEXTS)
    greedy = SamplingParams(n=n, temperature=0.0, max_new_tokens=12)
    a, b = fast.generate(batch, greedy), reference.generate(batch, greedy)
    assert torch.equal(a["responses"], b["responses"])
    assert torch.equal(a["response_mask"], b["response_mask"])
    assert torch.equal(a["input_ids"], b["input_ids"])
    assert torch.allclose(a["rollout_log_probs"], b["rollout_log_probs"], atol=1e-5)


def test_sampled_log_probs_match_a_forward_pass_at_the_sampling_temperature(engines):
    fast, _ = engines
    torch.manual_seed(0)
    out = fast.generate(prompts(fast.tokenizer, TEXTS), SamplingParams(n=4, temperature=0.7, max_new_tokens=8))
    r = out["responses"].shape[1]
    with torch.no_grad():
        logits = fast.model(input_ids=out["input_ids"], attention_mask=out["attention_mask"],
                            position_ids=out["position_ids"]).logits[:, -r - 1 : -1] / 0.7
    ref = torch.log_softmax(logits, -1).gather(-1, out["responses"].unsqueeze(-1)).squeeze(-1)
    mask = out["response_mask"].bool()
    assert torch.allclose(ref[mask], out["rollout_log_probs"][mask], atol=1e-5)
    assert out["rollout_log_probs"][~mask].eq(0).all()


def test_rows_are_padded_after_eos_and_decoding_stops_when_all_finished(engines):
    fast, _ = engines
    model, eos = fast.model, fast.eos_token_ids
    batch = prompts(fast.tokenizer, TEXTS[:2])
    with torch.no_grad():  # make EOS certain from the first step: every row stops at once
        bias = model.lm_head.weight.new_zeros(model.lm_head.weight.shape[0])
        bias[eos[0]] = 1e4
        handle = model.lm_head.register_forward_hook(lambda m, i, o: o + bias)
        try:
            tokens, log_probs = sample(model, batch["input_ids"], batch["attention_mask"], n=2, max_new_tokens=10,
                                       eos_token_ids=eos, pad_token_id=fast.pad_token_id)
        finally:
            handle.remove()
    assert tokens.shape == (4, 1) and tokens.eq(eos[0]).all()
    assert torch.allclose(log_probs, torch.zeros_like(log_probs), atol=1e-4)  # p(EOS) ~ 1


def test_warp_logits_equals_transformers_warpers():
    torch.manual_seed(0)
    logits = torch.randn(6, 50) * 3
    for temperature, top_k, top_p in [(1.0, 0, 1.0), (0.7, 0, 1.0), (1.3, 5, 1.0), (1.0, 0, 0.8), (0.9, 10, 0.6)]:
        expected = TemperatureLogitsWarper(temperature)(None, logits.clone())
        if top_k:
            expected = TopKLogitsWarper(top_k)(None, expected)
        if top_p < 1.0:
            expected = TopPLogitsWarper(top_p)(None, expected)
        assert torch.equal(warp_logits(logits, temperature, top_k, top_p), expected), (temperature, top_k, top_p)


def test_draw_follows_the_probabilities_and_never_draws_impossible_tokens():
    torch.manual_seed(0)
    probs = torch.tensor([[0.5, 0.0, 0.3, 0.2, 0.0]]).expand(200_000, 5).contiguous()
    tokens = draw(probs)
    freq = torch.bincount(tokens, minlength=5).float() / len(tokens)
    # binomial std of each frequency <= sqrt(0.25 / 2e5) = 0.0011: 0.005 is > 4 std
    assert torch.allclose(freq, probs[0], atol=0.005)
    assert freq[1] == 0 and freq[4] == 0


@pytest.fixture
def peaked(engines):
    """The random tiny model is near-uniform over 259 tokens (max p ~ 0.006), where a wrong temperature
    would not show: a fixed random bias (std 3) on its logits makes the distribution peaked."""
    model = engines[0].model
    bias = torch.randn(model.lm_head.weight.shape[0], generator=torch.Generator().manual_seed(0)) * 3
    handle = model.lm_head.register_forward_hook(lambda m, i, o: o + bias)
    yield
    handle.remove()


def first_token_distance(engine, temperature, top_k, top_p, expected_temperature=None, n=4000):
    """(TV distance of n sampled first tokens from softmax(warp(logits)), its expected value
    under exact sampling E[TV] ~ sum_v sqrt(p_v (1-p_v) / (2 pi n)), mass sampled outside the support)."""
    batch = prompts(engine.tokenizer, ["What is 5+6?"])
    torch.manual_seed(1)
    out = engine.generate(batch, SamplingParams(n=n, temperature=temperature, top_k=top_k, top_p=top_p, max_new_tokens=1))
    with torch.no_grad():
        logits = engine.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[0, -1]
    p = torch.softmax(warp_logits(logits[None].float(), expected_temperature or temperature, top_k, top_p), -1)[0]
    freq = torch.bincount(out["responses"][:, 0], minlength=p.shape[0]).float() / n
    expected_tv = float((p * (1 - p) / (2 * math.pi * n)).sqrt().sum())
    return float(0.5 * (freq - p).abs().sum()), expected_tv, float(freq[p == 0].sum())


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (1.5, 0, 1.0), (1.0, 20, 1.0), (1.2, 0, 0.9)])
def test_first_token_distribution_matches_the_model(engines, peaked, temperature, top_k, top_p):
    tv, expected_tv, outside = first_token_distance(engines[0], temperature, top_k, top_p)
    assert tv < 2 * expected_tv, (tv, expected_tv)
    assert outside == 0  # nothing outside the top-k / top-p set


def test_the_distribution_check_detects_a_wrong_temperature(engines, peaked):
    """The check above is sharp enough: samples at T=1.0 are far from the T=1.2 distribution."""
    tv, expected_tv, _ = first_token_distance(engines[0], 1.0, 0, 1.0, expected_temperature=1.2)
    assert tv > 3 * expected_tv, (tv, expected_tv)


def test_samples_of_a_prompt_share_one_prefill(engines):
    """The prompt pass runs over the distinct prompts only (U rows), then n rows per prompt decode."""
    fast, _ = engines
    rows = []
    handle = fast.model.register_forward_pre_hook(lambda m, a, kw: rows.append(kw["input_ids"].shape), with_kwargs=True)
    try:
        fast.generate(prompts(fast.tokenizer, TEXTS[:2]), SamplingParams(n=5, max_new_tokens=3))
    finally:
        handle.remove()
    assert rows[0][0] == 2 and all(r == (10, 1) for r in rows[1:])


def test_min_new_tokens_keeps_eos_out_until_then_as_generate_does(engines, peaked):
    fast, reference = engines
    batch = prompts(fast.tokenizer, TEXTS[:2])
    eos = fast.eos_token_ids[0]
    bias = torch.zeros(fast.model.lm_head.weight.shape[0])
    bias[eos] = 50.0  # EOS is the greedy choice at every step once allowed
    handle = fast.model.lm_head.register_forward_hook(lambda m, i, o: o + bias)
    try:
        greedy = SamplingParams(n=2, temperature=0.0, max_new_tokens=8, min_new_tokens=5)
        a, b = fast.generate(batch, greedy), reference.generate(batch, greedy)
        torch.manual_seed(0)
        sampled = fast.generate(batch, SamplingParams(n=8, max_new_tokens=8, min_new_tokens=5))
    finally:
        handle.remove()
    assert torch.equal(a["responses"], b["responses"])
    assert a["response_mask"].sum(dim=1).eq(6).all()  # 5 forced tokens, then EOS
    assert sampled["response_mask"].sum(dim=1).ge(6).all()
    assert not sampled["responses"][:, :5].eq(eos).any()


def test_lean_false_decodes_through_the_models_own_forward(engines, monkeypatch):
    """HFEngine(lean=False) (the exactness baseline in docs/performance.md) never builds the lean step."""
    import rlhf.rollout.decode as decode

    fast, _ = engines
    plain = HFEngine.sharing(fast.model, fast.tokenizer, lean=False)
    greedy = SamplingParams(n=2, temperature=0.0, max_new_tokens=6)
    expected = fast.generate(prompts(fast.tokenizer, TEXTS[:2]), greedy)

    def refuse(*args, **kwargs):
        raise AssertionError("LeanDecoder built although lean=False")

    monkeypatch.setattr(decode, "LeanDecoder", refuse)
    got = plain.generate(prompts(fast.tokenizer, TEXTS[:2]), greedy)
    assert torch.equal(got["responses"], expected["responses"])
    with pytest.raises(AssertionError, match="lean=False"):
        fast.generate(prompts(fast.tokenizer, TEXTS[:2]), greedy)  # the default does build it
