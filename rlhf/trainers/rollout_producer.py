"""The rollout producer: what makes a step's generated batch from its prompts.

`RLTrainer(rollout=...)` and `Evaluator(rollout=...)` call `rollout(policy, prompts, sampling)`
(or, with asynchronous rollout, `rollout.rollout(generate, prompts, sampling)` with the rollout
group's `generate`) and get `(batch, metrics)`: the generated rows (`sampling.n` per prompt, adjacent, in the
columns of rlhf.rollout.engine.rollout_batch) and the producer's own metrics. Single-turn
generation is one `policy.generate`; the multi-turn agent loop (rlhf.agents.AgentRollout) runs
environments between turns and returns the same columns, with `response_mask` marking only the
tokens the policy sampled; so does rlhf.agent_programs.AgentProgramRollout, which runs the user's own
OpenAI-client agent program against the recording gateway. The step after it (scoring, advantages, update) is the same for both.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Protocol

from rlhf.batch import Batch
from rlhf.rollout.sampling import SamplingParams

Generate = Callable[[Batch, SamplingParams], Batch]  # an engine's, a policy group's or a rollout group's `generate`


class RolloutProducer(Protocol):
    """(policy worker group, prompts, sampling) -> (generated batch, metrics)."""

    def __call__(self, policy, prompts: Batch, sampling: SamplingParams) -> tuple[Batch, dict[str, float]]: ...

    def rollout(self, generate: Generate, prompts: Batch, sampling: SamplingParams) -> tuple[Batch, dict[str, float]]:
        """The same with any `generate` (the asynchronous rollout group's, an engine's)."""
        ...


@dataclasses.dataclass(frozen=True)
class SingleTurn:
    """One response per sample: the policy group's `generate` (frozen: a signature default, shared safely)."""

    def __call__(self, policy, prompts: Batch, sampling: SamplingParams) -> tuple[Batch, dict[str, float]]:
        return policy.generate(prompts, sampling), {}

    def rollout(self, generate: Generate, prompts: Batch, sampling: SamplingParams) -> tuple[Batch, dict[str, float]]:
        return generate(prompts, sampling), {}
