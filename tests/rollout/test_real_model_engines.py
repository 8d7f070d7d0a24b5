"""The rollout engines on the real model (SmolLM2-135M-Instruct, fp32): greedy generation is token-identical
between the transformers engine with and without continuous batching, transformers' own `generate`, and
vLLM (the CPU build, in scripts/test_vllm.sh). Rows end at their own EOS at different steps, so the
continuous engine really drops rows mid-decoding."""

import pytest
import torch

from helpers import chat_batch
from rlhf.models.loading import load_causal_lm, load_tokenizer
from rlhf.rollout import HFEngine, SamplingParams

pytestmark = pytest.mark.real_model

QUESTIONS = ["What is 18+93?", "Say hi.", "What is the capital of France? Answer in one word.",
             "Name two colours.", "What is 7*8?", "Write one short sentence about the sea."]
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=40)


@pytest.fixture(scope="module")
def model_and_tokenizer(smollm2_path):
    return load_causal_lm(smollm2_path).eval(), load_tokenizer(smollm2_path)


def lengths(out):
    return out["response_mask"].sum(dim=1).tolist()


def test_smollm2_greedy_is_the_same_with_continuous_batching_a_row_cap_and_generate(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    batch = chat_batch(tokenizer, QUESTIONS)
    continuous = HFEngine.sharing(model, tokenizer).generate(batch, GREEDY)
    assert len(set(lengths(continuous))) >= 3 and min(lengths(continuous)) < 40  # rows end at different steps
    static = HFEngine.sharing(model, tokenizer, continuous_batching=False).generate(batch, GREEDY)
    capped = HFEngine.sharing(model, tokenizer, max_rows_per_call=4).generate(batch, GREEDY)  # refills slots
    reference = HFEngine.sharing(model, tokenizer, use_generate=True).generate(batch, GREEDY)
    for other in (static, capped, reference):
        assert torch.equal(continuous["responses"], other["responses"])
        assert torch.allclose(continuous["rollout_log_probs"], other["rollout_log_probs"], atol=1e-4)
    assert torch.equal(continuous["rollout_log_probs"], static["rollout_log_probs"])  # one wave: the same bits


@pytest.mark.vllm
def test_smollm2_greedy_is_token_identical_on_vllm(smollm2_path, model_and_tokenizer):
    from rlhf.rollout.vllm_engine import VLLMEngine

    model, tokenizer = model_and_tokenizer
    vllm = VLLMEngine(smollm2_path, dtype="float32", max_model_len=256, max_num_seqs=16)
    batch = chat_batch(vllm.tokenizer, QUESTIONS)
    ours = HFEngine.sharing(model, tokenizer).generate(batch, GREEDY)
    theirs = vllm.generate(batch, GREEDY)
    assert len(set(lengths(ours))) >= 3
    assert lengths(theirs) == lengths(ours)
    assert torch.equal(theirs["responses"], ours["responses"])
    mask = ours["response_mask"].bool()
    assert (theirs["rollout_log_probs"][mask] - ours["rollout_log_probs"][mask]).abs().max() < 1e-3
