"""Toy components for graph_io tests: importable by name, so fiddle can serialize them and a
subprocess can load them back."""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

import fiddle as fdl


class Tunable(fdl.Tag):
    """A hyper-parameter a sweep may change."""


class Logged(fdl.Tag):
    """A value worth showing in reports."""


class Mode(enum.Enum):
    TRAIN = "train"
    EVAL = "eval"


@dataclasses.dataclass
class Optimizer:
    lr: float = 1e-3
    betas: tuple = (0.9, 0.999)
    weight_decay: float = 0.0


@dataclasses.dataclass
class Policy:
    hidden: int = 64
    layers: int = 2
    name: str = "policy"
    optimizer: Any = None
    stop: list = dataclasses.field(default_factory=list)


def grpo_loss(log_probs=None, clip: float = 0.2, kl_coef: float = 0.0, agg: str = "token-mean"):
    return log_probs


def dapo_loss(log_probs=None, clip: float = 0.2, kl_coef: float = 0.0, agg: str = "token-mean"):
    return log_probs


def experiment(policy=None, ref=None, loss=None, seed: int = 0, mode: Mode = Mode.TRAIN, stages=()):
    return policy, ref, loss, seed, mode, stages
