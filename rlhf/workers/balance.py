"""Rows balanced across data-parallel ranks by token count.

A rank's step time grows with the tokens it holds, and every rank waits for the slowest at the
gradient all-reduce. With ragged lengths, contiguous shards (rows 0..B/k-1 to rank 0, ...)
can differ by a large factor; a partition of the rows by token count evens them out.

Two partitioners of weights w_1..w_n into k parts with equal item counts (n/k each, because
a training shard must have the same rows on every rank):

- `karmarkar_karp`: largest differencing (Karmarkar & Karp 1982), the method of verl's
  `get_seqlen_balanced_partitions`. Items sorted, cut into runs of k consecutive items; each run
  is a state of k parts holding one item each. The two states with the largest spread
  (max part sum - min part sum) are merged, the heaviest part of one with the lightest of the
  other, until one state is left. A merge's spread is at most the larger of the two spreads, so
  the final spread is at most the largest spread of a run: max part - min part <= max w - min w.
- `greedy_partition`: longest processing time first: items in decreasing order, each to the
  lightest part that still has room.

Measured on ragged token counts (benchmarks/micro_batching.py --balance): see docs/performance.md.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence

import numpy as np


def _check(weights: Sequence[float], k: int, equal_size: bool) -> None:
    if k < 1:
        raise ValueError(f"cannot partition into {k} parts; k must be >= 1")
    if equal_size and len(weights) % k:
        raise ValueError(f"cannot split {len(weights)} items into {k} parts of equal size; pad to a multiple of {k}")


def karmarkar_karp(weights: Sequence[float], k: int, equal_size: bool = True) -> list[list[int]]:
    """Indices of `weights` in k parts with near-equal sums (largest differencing method).

    equal_size: every part gets len(weights) / k items (which must divide). Parts are returned
    with their indices sorted, heaviest part first.
    """
    _check(weights, k, equal_size)
    w = np.asarray(weights, dtype=np.float64)
    order = np.argsort(w, kind="stable")
    if equal_size:
        runs = [order[i : i + k] for i in range(0, len(order), k)]
    else:
        runs = [order[i : i + 1] for i in range(len(order))]
    tie = itertools.count()  # a heap tie-breaker, so equal spreads merge in a fixed order
    heap = []
    for run in runs:
        parts = [(float(w[i]), [int(i)]) for i in run] + [(0.0, []) for _ in range(k - len(run))]
        parts.sort(key=lambda part: -part[0])
        heapq.heappush(heap, (-(parts[0][0] - parts[-1][0]), next(tie), parts))
    while len(heap) > 1:
        _, _, a = heapq.heappop(heap)
        _, _, b = heapq.heappop(heap)
        merged = [(sa + sb, ia + ib) for (sa, ia), (sb, ib) in zip(a, reversed(b))]
        merged.sort(key=lambda part: -part[0])
        heapq.heappush(heap, (-(merged[0][0] - merged[-1][0]), next(tie), merged))
    if not heap:
        return [[] for _ in range(k)]
    return [sorted(items) for _, items in heap[0][2]]


def greedy_partition(weights: Sequence[float], k: int, equal_size: bool = True) -> list[list[int]]:
    """Indices of `weights` in k parts: heaviest item first, each to the lightest part with room."""
    _check(weights, k, equal_size)
    w = np.asarray(weights, dtype=np.float64)
    room = len(w) // k if equal_size else len(w)
    sums, parts = [0.0] * k, [[] for _ in range(k)]
    for i in np.argsort(-w, kind="stable"):
        j = min((j for j in range(k) if len(parts[j]) < room), key=lambda j: sums[j])
        sums[j] += float(w[i])
        parts[j].append(int(i))
    return [sorted(p) for p in parts]


def imbalance(weights: Sequence[float], parts: Sequence[Sequence[int]]) -> float:
    """max part sum / mean part sum - 1: the fraction of time the busiest rank adds over a perfect split."""
    w = np.asarray(weights, dtype=np.float64)
    sums = np.array([w[list(p)].sum() for p in parts])
    return float(sums.max() / sums.mean() - 1.0) if sums.mean() > 0 else 0.0


def balanced_shards(tokens: Sequence[float], k: int, units: Sequence[np.ndarray] | None = None) -> list[np.ndarray]:
    """Row indices for each of k ranks, equal row counts, near-equal token sums (Karmarkar-Karp).

    tokens: (B,) tokens per row; B must be a multiple of k. units: runs of rows to keep on one
    rank (a GRPO group sharing its prompt). They are balanced as wholes when that keeps the row
    counts equal (every unit the same size and their number a multiple of k); otherwise rows
    are balanced one by one. Each rank's rows are in their original order.
    """
    tokens = np.asarray(tokens, dtype=np.float64)
    if len(tokens) % k:
        raise ValueError(f"cannot give {len(tokens)} rows to {k} ranks in equal shares; pad to a multiple of {k}")
    if units and len({len(u) for u in units}) == 1 and len(units) % k == 0 and len(units[0]) > 1:
        parts = karmarkar_karp([tokens[u].sum() for u in units], k, equal_size=True)
        return [np.sort(np.concatenate([units[i] for i in p])) if p else np.zeros(0, np.int64) for p in parts]
    return [np.asarray(p, dtype=np.int64) for p in karmarkar_karp(tokens, k, equal_size=True)]
