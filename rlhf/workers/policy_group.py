"""The driver's typed view of a group of `PolicyWorker`s: what `group.method(...)` takes and returns.

A worker group runs a worker method on every data-parallel rank (`rlhf.runtime.group.WorkerGroup`,
dispatched by the method's mark, `rlhf.workers.dispatch`): a `@shard` method takes and returns one
Batch for the whole group, an `@on_all_ranks` or `@shard_exact` one returns a list of per-rank
results. The group finds the method by name at run time, so this Protocol states it for readers and
editors: each method names the `PolicyWorker` method it runs (go to it from the docstring), with the
same parameters and the group's return type. `tests/workers/test_policy_group.py` keeps the two in
step (names, parameters, defaults, and the return type each dispatch mark gives).
"""

from __future__ import annotations

from typing import Any, Protocol

from rlhf.batch import Batch
from rlhf.rollout.sampling import SamplingParams
from rlhf.workers.precision import DType
from rlhf.workers.weight_sync import WeightSnapshot

__all__ = ["PolicyGroup"]


class PolicyGroup(Protocol):
    """A `WorkerGroup[PolicyWorker]` as the trainers call it."""

    name: str
    world_size: int

    def generate(self, prompts: Batch, sampling: SamplingParams, keep_awake: bool = False) -> Batch:
        """`PolicyWorker.generate` on every rank's shard: `sampling.n` responses per prompt, in row order."""
        ...

    def sleep_engine(self) -> list[None]:
        """`PolicyWorker.sleep_engine` on every rank."""
        ...

    def compute_log_probs(self, batch: Batch) -> Batch:
        """`PolicyWorker.compute_log_probs`: `old_log_probs` (B,T)."""
        ...

    def compute_token_stats(self, batch: Batch) -> Batch:
        """`PolicyWorker.compute_token_stats`: `old_log_probs` and `sum_pi_squared` (B,T)."""
        ...

    def compute_ref_log_probs(self, batch: Batch) -> Batch:
        """`PolicyWorker.compute_ref_log_probs`: `ref_log_probs` (B,T)."""
        ...

    def release_reference(self) -> list[int]:
        """`PolicyWorker.release_reference` on every rank: the bytes each freed."""
        ...

    def compute_teacher_log_probs(self, batch: Batch) -> Batch:
        """`PolicyWorker.compute_teacher_log_probs`: `teacher_log_probs` (B,T) (and the teacher's top-k columns)."""
        ...

    def update(self, batch: Batch) -> list[dict[str, float]]:
        """`PolicyWorker.update` on every rank's exact shard: each rank's metrics."""
        ...

    def requirements(self) -> list[dict[str, bool]]:
        """`PolicyWorker.requirements` of every rank (all the same)."""
        ...

    def save(self, path: str) -> list[str]:
        """`PolicyWorker.save` on every rank (rank 0 writes)."""
        ...

    def save_state(self, path: str) -> list[None]:
        """`PolicyWorker.save_state` on every rank."""
        ...

    def load_state(self, path: str) -> list[None]:
        """`PolicyWorker.load_state` on every rank."""
        ...

    def weights_finite(self) -> list[bool]:
        """`PolicyWorker.weights_finite` of every rank."""
        ...

    def publish_weights(self, version: int, dtype: DType, keep_from: int | None = None) -> list[WeightSnapshot | None]:
        """`PolicyWorker.publish_weights` (`PublishesWeights`) on every rank."""
        ...

    def serve_weights(self, receivers: int) -> list[tuple[str, int] | None]:
        """`PolicyWorker.serve_weights` (`PublishesWeights`) on every rank."""
        ...

    def stop_serving_weights(self) -> list[None]:
        """`PolicyWorker.stop_serving_weights` (`PublishesWeights`) on every rank."""
        ...

    def deferred(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Per-rank results of an `@on_all_ranks` method, left where the runtime keeps them (`WorkerGroup.deferred`)."""
        ...
