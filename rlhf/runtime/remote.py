"""Graph markers the compiler understands: `Remote` (run this sub-graph in a worker group)
and `StageOutput` (a value produced by an earlier stage of the experiment)."""

from __future__ import annotations

import dataclasses
from typing import Any

from rlhf.ranges import NonNegativeFloat, PositiveInt


@dataclasses.dataclass(frozen=True)
class Remote:
    """Build `worker` inside a group of `num_workers` data-parallel workers named `name`.

    In a graph: `fdl.Config(Remote, name="policy", worker=fdl.Config(PolicyWorker, ...))`.
    `compile()` cuts the graph here; the driver receives a `WorkerGroup` in its place.
    """

    worker: Any  # the sub-graph built on every worker
    name: str  # group name: shows in the Plan, logs, and Ray actor names
    num_workers: PositiveInt = 1  # data-parallel ranks
    cpus_per_worker: NonNegativeFloat = 1  # also the number of torch threads in the worker
    gpus_per_worker: NonNegativeFloat = 0
    colocate_with: str | None = None  # share the resource bundles of this group


@dataclasses.dataclass(frozen=True)
class StageOutput:
    """A value an earlier stage returns (e.g. the SFT checkpoint the RL stage starts from)."""

    stage: str
    key: str = "checkpoint"


@dataclasses.dataclass(frozen=True)
class GroupRef:
    """Placeholder the compiler leaves where a `Remote` stood; the runtime swaps in the group."""

    name: str
