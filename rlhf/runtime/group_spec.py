"""`GroupSpec`: one worker group of a Plan, as data (where it runs, the sub-graph its workers build).

Its own module so that placement rules (`rlhf.runtime.placement`) and the compiler
(`rlhf.runtime.plan`) both read it without importing each other.
"""

from __future__ import annotations

import dataclasses

import fiddle as fdl

from rlhf.graph.io import from_json


@dataclasses.dataclass(frozen=True)
class GroupSpec:
    """One worker group: where it runs and the sub-graph every worker builds."""

    name: str
    worker_json: str
    num_workers: int
    cpus_per_worker: float
    gpus_per_worker: float
    colocate_with: str | None

    @property
    def worker_cls(self) -> type:
        return fdl.get_callable(from_json(self.worker_json))

    @property
    def pool(self) -> str:
        return self.colocate_with or self.name
