"""The rollout producer: what makes a step's generated batch from its prompts.

`RLTrainer(rollout=...)` and `Evaluator(rollout=...)` call `rollout(policy, prompts, sampling)`
and get `(batch, metrics)`: the generated rows (`sampling.n` per prompt, adjacent, in the
columns of rlhf.rollout.engine.rollout_batch) and the producer's own metrics. Single-turn
generation is one `policy.generate`; the multi-turn agent loop (rlhf.agents.AgentRollout) runs
environments between turns and returns the same columns, with `response_mask` marking only the
tokens the policy sampled. The step after it (scoring, advantages, update) is the same for both.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

from rlhf.batch import Batch
from rlhf.rollout.sampling import SamplingParams


class RolloutProducer(Protocol):
    """(policy worker group, prompts, sampling) -> (generated batch, metrics)."""

    def __call__(self, policy, prompts: Batch, sampling: SamplingParams) -> tuple[Batch, dict[str, float]]: ...


@dataclasses.dataclass(frozen=True)
class SingleTurn:
    """One response per sample: the policy group's `generate` (frozen: a signature default, shared safely)."""

    def __call__(self, policy, prompts: Batch, sampling: SamplingParams) -> tuple[Batch, dict[str, float]]:
        return policy.generate(prompts, sampling), {}
