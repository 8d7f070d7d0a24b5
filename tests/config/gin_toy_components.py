"""Toy components and a toy graph for the gin-override tests (importable by name, so fiddle can
serialise them and gin files can name them by import path)."""

from __future__ import annotations

import dataclasses
from typing import Any

import fiddle as fdl


@dataclasses.dataclass
class Optimizer:
    params: Any = None
    lr: float = 1e-3
    weight_decay: float = 0.0


@dataclasses.dataclass
class Sampling:
    n: int = 1
    temperature: float = 1.0
    max_new_tokens: int = 32


@dataclasses.dataclass
class Worker:
    optimizer: Any = None
    micro_batch_size: int = 8
    dtype: str = "float32"


@dataclasses.dataclass
class Group:
    """Like `Remote`: a named group of workers."""

    worker: Any
    name: str
    num_workers: int = 1


@dataclasses.dataclass
class Evaluator:
    sampling: Any = None
    batch_size: int = 8


@dataclasses.dataclass
class Baseline:
    eps: float = 0.0


@dataclasses.dataclass
class Normalized:
    eps: float = 1e-6
    by_std: bool = True


@dataclasses.dataclass
class Trainer:
    policy: Any = None
    sampling: Any = None
    evaluator: Any = None
    advantage: Any = None
    hooks: Any = ()
    total_steps: int = 10


@dataclasses.dataclass
class Unused:
    """Never in the toy graph: an import-path selector may name it without error."""

    x: int = 0


def metrics(**columns: Any) -> dict:
    """Accepts any keyword argument."""
    return columns


@dataclasses.dataclass
class Root:
    stages: dict
    seed: int = 0


def toy_graph() -> fdl.Config[Root]:
    """Two stages; the greedy evaluation sampling is one node shared by both evaluators."""
    greedy = fdl.Config(Sampling, temperature=0.0)

    def stage(group: str, lr: float, n: int) -> fdl.Config:
        worker = fdl.Config(Worker, optimizer=fdl.Partial(Optimizer, lr=lr))
        return fdl.Config(
            Trainer,
            policy=fdl.Config(Group, worker=worker, name=group),
            sampling=fdl.Config(Sampling, n=n),
            evaluator=fdl.Config(Evaluator, sampling=greedy),
        )

    return fdl.Config(Root, stages={"sft": stage("policy", 0.1, 1), "grpo": stage("actor", 0.01, 8)})
