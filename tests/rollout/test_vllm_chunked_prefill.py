"""Regression: vLLM 0.32's CPU runner crashes on a seeded request whose prefill was split over steps.

With chunked prefill, a prompt longer than what is left of a step's token budget is prefilled in
pieces; the runner then discards the token sampled after a partial prefill and rewinds the
request's generator with `set_offset`, which a CPU `torch.Generator` refuses ("CPU Generator does
not use offset"). Every rollout here is seeded (row r gets seed + r), so `VLLMEngine` turns
chunked prefill off on CPU: a prompt is prefilled whole in one step or waits for the next.

Each test builds its own engine with the smallest step budget vLLM accepts without chunking
(`max_num_batched_tokens = max_model_len`), so six ~150-token prompts cannot share a step.
Real vLLM (the CPU build, `bash scripts/test_vllm.sh`); skipped where vLLM is absent.
"""

import gc

import pytest
import torch

from helpers import chat_batch, vllm_engine
from rlhf.rollout import SamplingParams

pytestmark = pytest.mark.vllm

BUDGET = 256  # tokens per engine step; = max_model_len (vLLM's minimum without chunked prefill)
LONG = ["a much longer question than the others, to force a prefill split " * 2 + str(i) for i in range(6)]
SAMPLED = SamplingParams(n=2, temperature=1.0, max_new_tokens=4)


def long_prompts(engine):
    batch = chat_batch(engine.tokenizer, LONG)
    lengths = batch["attention_mask"].sum(dim=1)
    # more prompt tokens than one step holds, and each prompt more than half of it: two never fit together
    assert lengths.sum() > BUDGET and (lengths > BUDGET // 2).all(), lengths
    return batch


def test_the_engine_never_splits_a_seeded_prefill_on_cpu():
    engine = vllm_engine(max_num_batched_tokens=BUDGET)
    try:
        scheduler = engine.llm.llm_engine.vllm_config.scheduler_config
        assert not scheduler.enable_chunked_prefill and scheduler.max_num_batched_tokens == BUDGET
        batch = long_prompts(engine)
        out = engine.generate(batch, SAMPLED, seed=3)  # crashed with chunked prefill (test below)
        assert out["responses"].shape == (2 * len(LONG), 4)
        # one step per prompt changed nothing: each prompt alone, with its rows' seeds, samples the same
        for i in range(len(LONG)):
            alone = engine.generate(batch.index([i]), SAMPLED, seed=3 + 2 * i)
            assert torch.equal(alone["responses"], out["responses"][2 * i: 2 * i + 2]), i
    finally:
        del engine
        gc.collect()


def test_vllm_cpu_still_crashes_when_chunked_prefill_is_forced_on():
    """The reason for the setting above. When this fails, vLLM's CPU build has fixed the bug and
    `VLLMEngine` may leave chunked prefill on (faster time to first token under mixed loads)."""
    engine = vllm_engine(max_num_batched_tokens=64, enable_chunked_prefill=True)
    try:
        assert engine.llm.llm_engine.vllm_config.scheduler_config.enable_chunked_prefill
        batch = chat_batch(engine.tokenizer, LONG)
        greedy = engine.generate(batch, SamplingParams(temperature=0.0, max_new_tokens=4))  # unseeded: fine
        assert greedy["responses"].shape[0] == len(LONG)
        with pytest.raises(RuntimeError, match="CPU Generator does not use offset"):
            engine.generate(batch, SAMPLED, seed=3)
    finally:
        del engine
        gc.collect()
