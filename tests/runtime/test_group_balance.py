"""Sharded calls balance rows across ranks by token count and give results back in row order.

`InProcessGroup` runs n real workers in this process (the WorkerGroup logic under test is the
driver side, the same for every runtime); tests/runtime/test_ray_runtime.py checks it on Ray.
"""

from collections.abc import Sequence
from typing import Any

import fiddle as fdl
import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from rlhf.batch import Batch
from rlhf.runtime.group import WorkerGroup
from rlhf.runtime.plan import compile_graph
from rlhf.runtime.remote import Remote
from toy_workers import EchoWorker


class InProcessGroup(WorkerGroup):
    """n workers built from the group's spec, called one after another in this process."""

    def __init__(self, n: int):
        spec = compile_graph(fdl.Config(Remote, worker=fdl.Config(EchoWorker), name="echo", num_workers=n)).groups["echo"]
        super().__init__(spec, world_size=n)
        self.workers = [EchoWorker() for _ in range(n)]

    def _run(self, method: str, per_rank: Sequence[tuple[tuple, dict]]) -> list[Any]:
        return [getattr(w, method)(*a, **kw) for w, (a, kw) in zip(self.workers, per_rank)]


def ragged(lengths, uids=None):
    """x = row index; attention_mask with `lengths[i]` real tokens (left padded)."""
    width = max(lengths)
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for i, n in enumerate(lengths):
        mask[i, width - n :] = 1
    non_tensors = {"uid": uids} if uids is not None else {}
    return Batch({"x": torch.arange(len(lengths)), "attention_mask": mask}, non_tensors)


def test_training_shards_are_balanced_and_exact():
    lengths = [90, 80, 70, 60, 10, 10, 10, 10]  # contiguous halves: 300 vs 40 tokens
    shards = InProcessGroup(2).rows(ragged(lengths))
    assert sorted(x for s in shards for x in s["x"]) == list(range(8))  # the union is the batch, once
    assert [len(s["x"]) for s in shards] == [4, 4]
    assert sorted(s["tokens"] for s in shards) == [170, 170]  # {90,60,10,10} / {80,70,10,10}
    group = InProcessGroup(2)
    group.balance = False  # the switch: contiguous shards again
    assert [s["tokens"] for s in group.rows(ragged(lengths))] == [300, 40]


def test_groups_stay_on_one_rank():
    lengths = [50, 40, 30, 20, 5, 5, 5, 5, 30, 30, 30, 30, 10, 10, 10, 10]
    uids = [f"u{i // 4}" for i in range(16)]
    shards = InProcessGroup(2).rows(ragged(lengths, uids))
    for s in shards:
        assert len(s["x"]) == 8
        assert all(sum(1 for x in s["x"] if x // 4 == g) in (0, 4) for g in range(4))
    # group sums 140, 20, 120, 40: best pairing 140+20 / 120+40 = 160 / 160
    assert sorted(s["tokens"] for s in shards) == [160, 160]


@given(st.lists(st.integers(1, 30), min_size=1, max_size=23), st.integers(1, 4))
def test_sharded_results_come_back_in_row_order(lengths, n):
    group = InProcessGroup(n)
    batch = ragged(lengths)
    out = group.double(batch)  # padded to a multiple of n, balanced, unpadded
    assert out["y"].tolist() == [2 * i for i in range(len(lengths))]
    samples = group.samples(batch, 3)  # 3 result rows per input row
    assert samples["x"].tolist() == [i for i in range(len(lengths)) for _ in range(3)]
    assert samples["sample"].tolist() == [0, 1, 2] * len(lengths)


def test_balance_off_for_a_method_keeps_contiguous_shards():
    out = InProcessGroup(2).double_contiguous(ragged([90, 80, 70, 60, 10, 10, 10, 10]))
    assert out["shard"].tolist() == [0] * 4 + [4] * 4
    assert out["y"].tolist() == [0, 2, 4, 6, 8, 10, 12, 14]


def test_a_result_that_cannot_be_put_back_is_a_clear_error():
    class Odd(InProcessGroup):
        def _run(self, method, per_rank):
            return [Batch({"y": torch.zeros(1)}) for _ in per_rank]  # one row per rank, whatever the shard

    with pytest.raises(ValueError, match="balance=False"):
        Odd(2).double(ragged([9, 8, 1, 2]))  # shards {0, 2} and {1, 3}
