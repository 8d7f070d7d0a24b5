"""`WorkerGroup`: the driver's handle on the workers of one group, whatever the runtime.

`group.generate(batch, sampling)` looks up how `generate` is dispatched (see
rlhf.workers.dispatch), shards or broadcasts the arguments over the ranks, runs the method on
every worker and gathers the results. Subclasses only say how to run one call per rank.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from typing import Any

from rlhf.batch import Batch
from rlhf.runtime.plan import GroupSpec
from rlhf.workers.dispatch import dispatch_mode


class WorkerGroup(abc.ABC):
    """Calls worker methods across data-parallel ranks; subclasses implement `_run`."""

    def __init__(self, spec: GroupSpec, world_size: int):
        self.spec = spec
        self.name = spec.name
        self.world_size = world_size
        self._worker_cls = spec.worker_cls

    @abc.abstractmethod
    def _run(self, method: str, per_rank: Sequence[tuple[tuple, dict]]) -> list[Any]:
        """Run `method` on rank r with per_rank[r] = (args, kwargs); results in rank order."""

    def shutdown(self) -> None:
        """Release the workers."""

    def __getattr__(self, method: str) -> Callable[..., Any]:
        if method.startswith("_"):
            raise AttributeError(method)
        mode = dispatch_mode(self._worker_cls, method)

        def call(*args: Any, **kwargs: Any) -> Any:
            return self.call(method, mode, args, kwargs)

        call.__name__ = method
        return call

    def call(self, method: str, mode: str, args: tuple, kwargs: dict) -> Any:
        n = self.world_size
        if mode == "all":
            return self._run(method, [(args, kwargs)] * n)
        if not args or not isinstance(args[0], Batch):
            raise TypeError(f"{self.name}.{method} is sharded: its first argument must be a Batch")
        batch, rest = args[0], args[1:]
        pad = 0
        if mode == "shard":
            batch, pad = batch.pad_to_multiple(n)
        elif len(batch) % n:
            raise ValueError(
                f"{self.name}.{method} got {len(batch)} rows, which do not split evenly over {n} workers "
                f"(padding would train on repeated rows). Make the batch size a multiple of {n}."
            )
        shards = batch.chunk(n)
        results = self._run(method, [((s, *rest), kwargs) for s in shards])
        if all(isinstance(r, Batch) for r in results):
            return Batch.concat(results).unpad(pad)
        return results
