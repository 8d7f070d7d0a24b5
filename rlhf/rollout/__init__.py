"""Rollout engines: `generate(prompts: Batch, sampling) -> Batch` (responses, mask, engine log-probs)."""

from rlhf.rollout.hf_engine import HFEngine
from rlhf.rollout.sampling import SamplingParams, response_mask_from_eos

__all__ = ["HFEngine", "SamplingParams", "response_mask_from_eos"]
