"""Vectorised per-group statistics.

Notation: B samples; `group_ids` (B,) int64: samples generated from the same prompt share
an id (arbitrary values, not necessarily contiguous or sorted); G distinct groups.
Everything is a scatter/gather over `inverse` (B,), the position of each sample's group
among the sorted distinct ids: no Python loop over samples or groups.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor


class Groups(NamedTuple):
    """inverse: (B,) group index in [0, G) of each sample; size: (G,) samples per group."""

    inverse: Tensor
    size: Tensor

    @property
    def num_groups(self) -> int:
        return self.size.shape[0]

    def sum(self, x: Tensor) -> Tensor:
        """Per-group sum of x (B, ...) -> (G, ...)."""
        out = x.new_zeros((self.num_groups, *x.shape[1:]))
        return out.index_add_(0, self.inverse, x)

    def mean(self, x: Tensor) -> Tensor:
        """Per-group mean of x (B, ...) -> (G, ...)."""
        n = self.size.to(x.dtype).reshape(-1, *([1] * (x.dim() - 1)))
        return self.sum(x) / n

    def std(self, x: Tensor) -> Tensor:
        """Per-group unbiased standard deviation of x (B,) -> (G,); 0 for singleton groups."""
        centred = x - self.mean(x)[self.inverse]
        n = self.size.to(x.dtype)
        return torch.sqrt(self.sum(centred * centred) / (n - 1).clamp_min(1))

    def amax(self, x: Tensor) -> Tensor:
        """Per-group max of x (B,) -> (G,)."""
        out = torch.full((self.num_groups,), float("-inf"), dtype=x.dtype, device=x.device)
        return out.scatter_reduce(0, self.inverse, x, reduce="amax", include_self=True)

    def amin(self, x: Tensor) -> Tensor:
        """Per-group min of x (B,) -> (G,)."""
        out = torch.full((self.num_groups,), float("inf"), dtype=x.dtype, device=x.device)
        return out.scatter_reduce(0, self.inverse, x, reduce="amin", include_self=True)

    def broadcast(self, per_group: Tensor) -> Tensor:
        """(G, ...) -> (B, ...): each sample gets its group's value."""
        return per_group[self.inverse]


def group_by(group_ids: Tensor) -> Groups:
    """Index the groups of `group_ids` (B,) int64."""
    if group_ids.dim() != 1:
        raise ValueError(f"group_ids must be (B,), got shape {tuple(group_ids.shape)}")
    _, inverse, size = torch.unique(group_ids, return_inverse=True, return_counts=True)
    return Groups(inverse, size)


def group_ids_from_uids(uids: Sequence[Any] | np.ndarray) -> Tensor:
    """(B,) int64 group ids from per-sample prompt uids (the Batch's non-tensor `uid`
    column: strings or any hashable, comparable values); equal uids -> equal ids."""
    _, inverse = np.unique(np.asarray(uids, dtype=object).astype(str), return_inverse=True)
    return torch.as_tensor(inverse.reshape(-1), dtype=torch.int64)
