"""PF-PPO: Policy Filtration for PPO (Zhang et al. 2024, arXiv:2409.06957).

A reward model is more reliable at the extremes of its score range, so PF-PPO trains on
samples drawn in proportion to a weight of their score: the batch is resampled with
replacement (as verl does) after the advantage step. Notation: B batch; scores (B,)
sequence rewards. A weighting is chosen by putting its class in the graph:
`pf_ppo=fdl.Config(PowWeights, power=2.0)`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

Weighting = Callable[[Tensor], Tensor]


class PowWeights:
    """w_i = |score_i|^power (paper's "pow", verl default power 2): favours confident scores."""

    def __init__(self, power: float = 2.0):
        self.power = power

    def __call__(self, scores: Tensor) -> Tensor:
        return scores.abs().pow(self.power)

    def __repr__(self) -> str:
        return f"PowWeights(power={self.power})"


class MaxMinWeights:
    """w_i = 1 if score_i is the batch max or min, else 0 (paper's BoN/WoN "max_min")."""

    def __call__(self, scores: Tensor) -> Tensor:
        return ((scores == scores.max()) | (scores == scores.min())).to(scores.dtype)

    def __repr__(self) -> str:
        return "MaxMinWeights()"


class MaxRandomWeights:
    """w_i = max_weight if score_i is the batch max, else other_weight ("max_random")."""

    def __init__(self, max_weight: float = 0.4, other_weight: float = 0.1):
        self.max_weight = max_weight
        self.other_weight = other_weight

    def __call__(self, scores: Tensor) -> Tensor:
        return torch.where(scores == scores.max(), self.max_weight, self.other_weight).to(scores.dtype)

    def __repr__(self) -> str:
        return f"MaxRandomWeights(max_weight={self.max_weight}, other_weight={self.other_weight})"


def pf_ppo_resample(
    scores: Tensor,
    weighting: Weighting,
    num_samples: int | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Row indices for the PF-PPO resampled batch: i ~ Categorical(w / sum w), with replacement.

    scores: (B,). weighting: maps scores (B,) to weights (B,) >= 0 (e.g. `PowWeights()`).
    num_samples: rows to draw (None: B). generator: for reproducibility.
    Weights get +1e-8 so an all-zero weighting falls back to uniform sampling.
    Returns (num_samples,) int64; apply with `batch.index(rows)`.
    """
    with torch.no_grad():
        w = weighting(scores.to(torch.float64)).clamp_min(0) + 1e-8
        n = scores.shape[0] if num_samples is None else num_samples
        return torch.multinomial(w, n, replacement=True, generator=generator)
