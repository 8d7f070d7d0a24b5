"""Parallel scoring: same results as in-process, one persistent pool, timeouts that kill, clean errors."""

import functools
import logging
import pickle
import time

import pytest
from worker_scorers import LoadsNowhere, misbehaving, scaled, scaled_row, with_extras, worker_pid

from rlhf.data import arithmetic_rows, countdown_rows, ground_truth, gsm8k_like_rows
from rlhf.rewards import RewardManager, ScorerError, WorkerPoolError, default_scorers
from rlhf.rewards.pool import WorkerPool

TIMEOUT_S = 0.5


@pytest.fixture(scope="module")
def parallel():
    """One pool for the module's tests: starting workers is what costs (~0.5 s each)."""
    scorers = {"x": misbehaving, "extras": with_extras, "len": functools.partial(scaled, factor=0.5),
               "pid": worker_pid}
    with RewardManager(scorers, strict=False, fallback_score=-1.0, num_workers=2, timeout_s=TIMEOUT_S,
                       chunk_size=4) as manager:
        yield manager


def call(manager, responses, sources, truths=None):
    n = len(responses)
    return manager(responses, sources, truths or ["1"] * n, [None] * n)


def mixed_rows():
    rows = arithmetic_rows(40, seed=1) + gsm8k_like_rows(40, seed=1) + countdown_rows(40, seed=1)
    responses = []
    for i, row in enumerate(rows):  # correct, wrong and malformed answers
        info, truth = row["extra_info"], ground_truth(row)
        right = f"<answer>{info['solution']}</answer>" if "solution" in info else info["answer"]
        responses.append([right, "#### 0 <answer>1+</answer>", "no answer at all", truth][i % 4])
    return responses, [r["data_source"] for r in rows], [ground_truth(r) for r in rows], [r["extra_info"] for r in rows]


def test_same_scores_extras_and_metrics_as_in_process():
    args = mixed_rows()
    sequential = RewardManager(default_scorers())(*args)
    with RewardManager(default_scorers(), num_workers=2) as manager:
        assert manager(*args) == sequential
        assert manager(*args) == sequential  # the second call reuses the pool
    assert 0 < sum(sequential.scores) < len(sequential.scores)  # a real mix of right and wrong


def test_failures_match_in_process_scoring(parallel):
    responses = ["1", "boom", "22", "exit", "1", "x"]
    sequential = RewardManager({"x": misbehaving}, strict=False, fallback_score=-1.0)
    expected = call(sequential, responses, ["x"] * 6)
    out = call(parallel, responses, ["x"] * 6)
    assert out.scores == expected.scores == [1.0, -1.0, 0.0, -1.0, 1.0, 0.0]
    assert out.metrics == {**expected.metrics, "reward/timeouts": 0.0}
    assert out.metrics["reward/errors"] == 2.0


def test_extras_and_partial_scorers_travel(parallel):
    out = call(parallel, ["1", "abcd", "22"], ["extras", "len", "extras"])
    assert out.scores == [1.0, 2.0, 0.0]  # len("abcd") * 0.5
    assert out.extras == {"length": [1, None, 2], "pid": ["same", None, "same"]}


def test_pool_is_persistent_and_rows_go_in_chunks(parallel):
    call(parallel, ["1"] * 8, ["x"] * 8)
    started = parallel._pool.processes_started
    pids = set(call(parallel, ["1"] * 40, ["pid"] * 40).scores)
    pids |= set(call(parallel, ["1"] * 40, ["pid"] * 40).scores)
    assert parallel._pool.processes_started == started  # no process start-up per call
    assert len(pids) <= 2  # two workers did all the work


@pytest.mark.parametrize("stuck", ["hang", "sleep"])
def test_a_stuck_scorer_is_killed_at_its_timeout(parallel, stuck, caplog):
    started = parallel._pool.processes_started
    responses = ["1", "1", stuck, "1", "2", "1", "1", "1"]
    begin = time.monotonic()
    with caplog.at_level(logging.WARNING):
        out = call(parallel, responses, ["x"] * 8)
    elapsed = time.monotonic() - begin
    assert out.scores == [1.0, 1.0, -1.0, 1.0, 0.0, 1.0, 1.0, 1.0]  # the others still scored
    assert out.metrics["reward/timeouts"] == 1.0 and out.metrics["reward/errors"] == 1.0
    assert TIMEOUT_S <= elapsed < TIMEOUT_S + 5  # bounded by the timeout, plus a replacement start
    assert parallel._pool.processes_started == started + 1  # the stuck worker was replaced
    assert "row 2" in caplog.text and "timeout_s=0.5" in caplog.text
    assert call(parallel, ["1", "2"], ["x", "x"]).scores == [1.0, 0.0]  # and the pool still works


def test_a_worker_that_dies_fails_only_its_row(parallel):
    out = call(parallel, ["1", "die", "1", "2"], ["x"] * 4)
    assert out.scores == [1.0, -1.0, 1.0, 0.0]
    assert out.metrics["reward/errors"] == 1.0 and out.metrics["reward/timeouts"] == 0.0


def test_unpicklable_result_is_a_row_error(parallel):
    out = call(parallel, ["unpicklable", "1"], ["x", "x"])
    assert out.scores == [-1.0, 1.0]


def test_strict_names_row_source_and_reason():
    with RewardManager({"x": misbehaving}, num_workers=1, timeout_s=TIMEOUT_S) as manager:
        with pytest.raises(ScorerError, match=r"data_source 'x' failed on row 1: RuntimeError: scorer exploded"):
            call(manager, ["1", "boom", "1"], ["x"] * 3)
        with pytest.raises(ScorerError, match=r"row 2: did not finish within timeout_s=0.5 s") as info:
            call(manager, ["1", "1", "hang"], ["x"] * 3)
        assert "strict=False" in str(info.value) and "worker process" in str(info.value)


def test_timeout_needs_workers_and_unpicklable_scorers_are_refused():
    with pytest.raises(ValueError, match="timeout_s needs num_workers >= 1"):
        RewardManager({"x": misbehaving}, timeout_s=1.0)
    with pytest.raises(TypeError, match=r"data_source 'local'.*cannot be sent to worker processes.*module level"):
        RewardManager({"local": lambda s, g, e=None: 1.0}, num_workers=1)
    RewardManager({"local": lambda s, g, e=None: 1.0})  # fine in-process


def test_a_scorer_that_cannot_load_in_a_worker_is_a_clear_error():
    with RewardManager({"x": LoadsNowhere()}, num_workers=1) as manager:
        with pytest.raises(WorkerPoolError, match="could not load the scorers: ImportError.*module level"):
            call(manager, ["1"], ["x"])


def test_close_context_manager_and_pickling():
    manager = RewardManager({"x": misbehaving}, num_workers=1)
    assert call(manager, ["1"], ["x"]).scores == [1.0]
    workers = [w.process for w in manager._pool._workers]
    copy = pickle.loads(pickle.dumps(manager))  # e.g. sent to a Ray worker: no pool travels
    assert copy._pool is None and copy.num_workers == 1
    manager.close()
    manager.close()  # idempotent
    assert manager._pool is None and not any(p.is_alive() for p in workers)
    assert call(manager, ["2"], ["x"]).scores == [0.0]  # a later call starts a new pool
    manager.close()


def test_pool_map_orders_outcomes_and_closes():
    pool = WorkerPool(scaled_row, 10.0, num_workers=2, timeout_s=None, chunk_size=3)
    try:
        assert pool.map([("ab",), ("abcd",), ("",)] * 3) == [("ok", 20.0), ("ok", 40.0), ("ok", 0.0)] * 3
        assert pool.map([]) == []
    finally:
        pool.close()
    with pytest.raises(WorkerPoolError, match="after close"):
        pool.map([("a",)])



def test_rows_that_cannot_travel_are_a_clear_error(parallel):
    with pytest.raises(WorkerPoolError, match="rows cannot be sent to worker processes.*plain data"):
        parallel(["1"], ["x"], ["1"], [{"callback": lambda: None}])
    assert call(parallel, ["1"], ["x"]).scores == [1.0]  # the pool restarts afterwards
