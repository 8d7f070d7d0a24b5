"""Partitioning rows across ranks by token count: Karmarkar-Karp against greedy, and their guarantees."""

import itertools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlhf.workers.balance import balanced_shards, greedy_partition, imbalance, karmarkar_karp


def sums(weights, parts):
    return sorted(sum(weights[i] for i in p) for p in parts)


def test_karmarkar_karp_by_hand():
    # 2 parts of 3: runs [1,2] [3,4] [5,6] -> states {2|1} {4|3} {6|5}, spread 1 each;
    # ties merge in order: {2|1} with {4|3}: {2+3 | 1+4} = {5|5}; then {6|5} with {5|5}: {11|10}.
    w = [1, 2, 3, 4, 5, 6]
    parts = karmarkar_karp(w, 2)
    assert sums(w, parts) == [10, 11] and sorted(len(p) for p in parts) == [3, 3]
    # greedy: 6->A, 5->B, 4->B (9), 3->A (9), 2->A (11, full), 1->B (10)
    assert sums(w, greedy_partition(w, 2)) == [10, 11]


def test_karmarkar_karp_beats_greedy_where_greedy_is_known_to_lose():
    # LPT on {8,7,6,5,4} into 2 parts (no size limit): {8,5,4}=17 / {7,6}=13; optimum 15 / 15 = {8,7} / {6,5,4}
    w = [8, 7, 6, 5, 4]
    assert sums(w, greedy_partition(w, 2, equal_size=False)) == [13, 17]
    # differencing: {8|7} (spread 1), {6|5} (1), then {4} with {8|7}: {11|8} (3), then with {6|5}: {16|14}
    assert sums(w, karmarkar_karp(w, 2, equal_size=False)) == [14, 16]


@given(st.lists(st.integers(1, 400), min_size=1, max_size=64), st.integers(1, 8))
def test_equal_size_partition_properties(raw, k):
    w = raw[: len(raw) - len(raw) % k] or raw[:k] * k  # a multiple of k items
    for partition in (karmarkar_karp, greedy_partition):
        parts = partition(w, k)
        assert len(parts) == k
        assert sorted(i for p in parts for i in p) == list(range(len(w)))  # every item exactly once
        assert {len(p) for p in parts} == {len(w) // k}  # equal sizes
    # differencing never widens a spread: max part - min part <= max w - min w
    s = sums(w, karmarkar_karp(w, k))
    assert s[-1] - s[0] <= max(w) - min(w)


@pytest.mark.parametrize("k,n", [(2, 8), (3, 9), (2, 10)])
def test_karmarkar_karp_is_near_optimal_on_small_inputs(k, n):
    rng = np.random.default_rng(k * 100 + n)
    worst = 0.0
    for _ in range(20):
        w = rng.integers(20, 500, size=n).tolist()
        best = min(
            max(sum(w[i] for i in c), sum(w) - sum(w[i] for i in c))
            for c in itertools.combinations(range(n), n // k)
        ) if k == 2 else None
        got = sums(w, karmarkar_karp(w, k))[-1]
        if best is not None:
            worst = max(worst, got / best - 1)
        assert got <= sum(w) / k + max(w)
    assert worst <= 0.05  # within 5% of the optimum on every draw (k = 2, brute force)


def test_karmarkar_karp_is_at_least_as_balanced_as_greedy_on_ragged_lengths():
    rng = np.random.default_rng(0)
    kk, lpt = [], []
    for _ in range(50):
        tokens = rng.integers(20, 200, 64) + rng.integers(5, 300, 64)  # prompt + response, ragged
        kk.append(imbalance(tokens, karmarkar_karp(tokens, 4)))
        lpt.append(imbalance(tokens, greedy_partition(tokens, 4)))
    assert np.mean(kk) <= np.mean(lpt)
    assert max(kk) < 0.01  # the busiest of 4 ranks within 1% of the mean


def test_balanced_shards_keeps_groups_whole_when_counts_allow():
    tokens = np.array([100, 90, 80, 70, 10, 10, 10, 10, 60, 50, 40, 30, 20, 20, 20, 20])
    units = [np.arange(i, i + 4) for i in range(0, 16, 4)]
    shards = balanced_shards(tokens, 2, units)
    assert sorted(np.concatenate(shards).tolist()) == list(range(16))
    for s in shards:
        assert len(s) == 8 and list(s) == sorted(s)
        assert all(set(u) <= set(s) or not set(u) & set(s) for u in units)  # a group is on one rank
    # group sums 340, 40, 180, 80: the best pairing is 340+40 / 180+80 (KK: {80|40} merged into {340|180})
    assert sorted(int(tokens[s].sum()) for s in shards) == [260, 380]
    # groups of unequal size cannot keep equal row counts: rows are balanced one by one
    uneven = [np.arange(0, 3), np.arange(3, 8), np.arange(8, 16)]
    shards = balanced_shards(tokens, 2, uneven)
    assert [len(s) for s in shards] == [8, 8]
    assert sorted(int(tokens[s].sum()) for s in shards) == [320, 320]


def test_balanced_shards_refuses_uneven_row_counts():
    with pytest.raises(ValueError, match="multiple of 2"):
        balanced_shards([1, 2, 3], 2)
