"""bf16 generation on CUDA: the HF engine's own loop (lean step, checks every 16 steps) against `generate`.

Skipped without a CUDA device. Two random models:
- `engine`, the tiny model at its initial scale: its greedy choice leads the runner-up by
  >= 0.146 (logits within +-0.5, a bf16 ulp of 1/256 there), so two correct bf16 computations
  (the lean step's fused matmuls, the model's SDPA forward) must pick the same tokens. Its
  greedy text repeats one token, so it checks the pipeline (positions, padding, cache, EOS),
  and the log-probs check the numbers.
- `sharp_engine`, a bigger one with its matrices scaled by 3: a peaked next-token distribution
  that depends on the context, where a wrong position or cache entry moves the log-probs by far
  more than bf16 rounding (measured on CPU in bf16: max 0.031, mean 0.006).
Greedy tokens are compared up to the first step where `generate`'s own top two logits are
closer than NEAR_TIE (none with the tiny model on CPU), so a legitimate rounding tie cannot fail them.
"""

import pytest
import torch

from rlhf.batch import Batch
from rlhf.data.tokenize import chat_prompt_ids, left_pad, position_ids
from rlhf.models.loading import load_causal_lm, load_tokenizer
from rlhf.rollout import HFEngine, SamplingParams
from rlhf.rollout.decode import default_check_every
from rlhf.rollout.lean_decoder import supports
from helpers import tiny_model_path

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

DEVICE = torch.device("cuda")
TEXTS = ["What is 12+30?", "x", "a much longer prompt than the others, to force left padding", "Hi there"]
NEAR_TIE = 0.05  # logits ~ +-2 in bf16 have an ulp of 1/64: two kernel orders can differ by a few ulps
NEW_TOKENS = 24


def bf16_engine(hidden_size: int, scale: float = 1.0) -> HFEngine:
    path = tiny_model_path(hidden_size=hidden_size)
    model = load_causal_lm(path, dtype="bfloat16")
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.mul_(scale)
    return HFEngine.sharing(model.to(DEVICE).eval(), load_tokenizer(path))


@pytest.fixture(scope="module")
def engine():
    return bf16_engine(32)


@pytest.fixture(scope="module")
def sharp_engine():
    """1M parameters, matrices x3: its greedy text has 3 to 11 distinct tokens per 24."""
    return bf16_engine(128, scale=3.0)


def prompts(tok):
    ids, mask = left_pad([chat_prompt_ids(tok, [{"role": "user", "content": t}]) for t in TEXTS], tok.pad_token_id)
    batch = Batch({"input_ids": ids, "attention_mask": mask, "position_ids": position_ids(mask)}, {"uid": TEXTS})
    return batch.to(DEVICE)


def test_greedy_bf16_tokens_equal_generate_up_to_the_first_near_tie(engine):
    assert supports(engine.model) and default_check_every(DEVICE) == 16  # the path under test
    batch = prompts(engine.tokenizer)
    ours = engine.generate(batch, SamplingParams(n=2, temperature=0.0, max_new_tokens=NEW_TOKENS))
    repeated = batch.repeat(2, interleave=True)
    with torch.no_grad():
        out = engine.model.generate(
            input_ids=repeated["input_ids"], attention_mask=repeated["attention_mask"], do_sample=False,
            max_new_tokens=NEW_TOKENS, eos_token_id=engine.eos_token_ids, pad_token_id=engine.pad_token_id,
            return_dict_in_generate=True, output_logits=True,
        )
    theirs = out.sequences[:, repeated["input_ids"].shape[1]:]
    logits = torch.stack(out.logits, dim=1).float()  # (B, R, V)
    expected = torch.log_softmax(logits, -1).gather(-1, theirs[..., None]).squeeze(-1)
    top2 = logits.topk(2, dim=-1).values
    tied = (top2[..., 0] - top2[..., 1]) <= NEAR_TIE  # (B, R): steps where bf16 may pick either token
    assert ours["responses"].shape[1] == theirs.shape[1]
    compared = 0
    for row in range(theirs.shape[0]):
        ties = tied[row].nonzero()
        k = int(ties[0]) if len(ties) else theirs.shape[1]  # compare the steps before the first near-tie
        compared += k
        assert torch.equal(ours["responses"][row, :k], theirs[row, :k]), row
        assert (ours["rollout_log_probs"][row, :k] - expected[row, :k]).abs().max() < NEAR_TIE, row
    assert compared >= theirs.numel() // 2, "near-ties cut most of the comparison: the check says little"


def test_sampled_bf16_log_probs_are_finite_and_match_a_forward_pass(sharp_engine):
    engine = sharp_engine
    batch = prompts(engine.tokenizer)
    torch.manual_seed(0)
    out = engine.generate(batch, SamplingParams(n=4, temperature=0.8, max_new_tokens=NEW_TOKENS))
    lp, mask = out["rollout_log_probs"], out["response_mask"].bool()
    assert lp.dtype == torch.float32 and torch.isfinite(lp).all() and (lp[mask] <= 0).all()
    r = out["responses"].shape[1]
    with torch.no_grad():
        logits = engine.model(input_ids=out["input_ids"], attention_mask=out["attention_mask"],
                              position_ids=out["position_ids"]).logits[:, -r - 1 : -1].float() / 0.8
    ref = torch.log_softmax(logits, -1).gather(-1, out["responses"].unsqueeze(-1)).squeeze(-1)
    diff = (ref - lp)[mask].abs()
    assert diff.max() < NEAR_TIE and diff.mean() < 0.01  # bf16 rounding, not a wrong token or position


def test_the_check_cadence_and_chunks_do_not_change_cuda_outputs(engine, sharp_engine):
    batch = prompts(engine.tokenizer)
    sampling = SamplingParams(n=3, temperature=1.0, max_new_tokens=NEW_TOKENS)
    outs = []
    for check_every in (1, 16):  # same kernels on the same shapes: the same numbers, cut at the same step
        torch.manual_seed(0)
        sharp = sharp_engine
        outs.append(HFEngine.sharing(sharp.model, sharp.tokenizer, check_every=check_every).generate(batch, sampling))
    assert torch.equal(outs[0]["responses"], outs[1]["responses"])
    assert torch.equal(outs[0]["rollout_log_probs"], outs[1]["rollout_log_probs"])
    greedy = SamplingParams(n=2, temperature=0.0, max_new_tokens=NEW_TOKENS)
    whole = engine.generate(batch, greedy)
    chunked = HFEngine.sharing(engine.model, engine.tokenizer, max_rows_per_call=4).generate(batch, greedy)
    # chunks are trimmed to their own longest prompt: other shapes, other bf16 rounding, far from any tie
    assert torch.equal(chunked["responses"], whole["responses"])
    assert (chunked["rollout_log_probs"] - whole["rollout_log_probs"]).abs().max() < NEAR_TIE
