"""A toy experiment module for override tests."""

import dataclasses

import fiddle as fdl


@dataclasses.dataclass
class Trainer:
    total_steps: int = 10
    lr: float = 0.1
    name: str = "t"


@dataclasses.dataclass
class Root:
    stages: dict
    seed: int = 0


def base(steps: int = 10) -> fdl.Config:
    return fdl.Config(Root, stages={"sft": fdl.Config(Trainer, total_steps=steps), "grpo": fdl.Config(Trainer)})


def tiny(cfg, lr: float = 0.5) -> None:
    cfg.stages["grpo"].lr = lr
