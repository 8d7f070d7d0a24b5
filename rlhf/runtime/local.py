"""LocalRuntime: every worker group in the driver process, world size 1.

`breakpoint()` works anywhere, tests are fast, and results equal Ray's with one worker:
workers are still rebuilt from the Plan's fiddle JSON, exactly as a Ray actor does.
"""

from __future__ import annotations

import gc
import warnings
from collections.abc import Sequence
from typing import Any

import fiddle as fdl
import torch

from rlhf.graph.io import from_json
from rlhf.runtime.group import WorkerGroup
from rlhf.runtime.plan import GroupSpec, Plan


class LocalWorkerGroup(WorkerGroup):
    in_process = True  # its workers live in the driver: results pass as objects

    def __init__(self, spec: GroupSpec):
        super().__init__(spec, world_size=1)
        if spec.num_workers > 1:
            warnings.warn(
                f"LocalRuntime runs group {spec.name!r} with 1 worker instead of {spec.num_workers}", stacklevel=2
            )
        # Same thread count as a Ray worker of this group, so Local and Ray compute identically.
        torch.set_num_threads(max(1, int(spec.cpus_per_worker)))
        self.worker = fdl.build(from_json(spec.worker_json))

    def _run(self, method: str, per_rank: Sequence[tuple[tuple, dict]]) -> list[Any]:
        (args, kwargs), = per_rank
        return [getattr(self.worker, method)(*args, **kwargs)]

    def shutdown(self) -> None:
        self.worker = None


class LocalRuntime:
    """Runs a Plan in this process."""

    def __init__(self) -> None:
        self._groups: list[WorkerGroup] = []

    def start_groups(self, plan: Plan) -> dict[str, WorkerGroup]:
        groups = {name: LocalWorkerGroup(spec) for name, spec in plan.groups.items()}
        self._groups.extend(groups.values())
        return groups

    def stop_groups(self) -> None:
        """Drop every group's worker and free its memory now. A worker's model is held in reference cycles
        (module hooks, FSDP state, the engine's back-references), which only the cyclic collector frees: without
        the collection, a finished stage's weights, gradients and optimizer state could still occupy the device
        while the next stage builds its own."""
        for g in self._groups:
            g.shutdown()
        self._groups = []
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def shutdown(self) -> None:
        self.stop_groups()

    def describe(self) -> str:
        return "LocalRuntime (in-process, world size 1)"
