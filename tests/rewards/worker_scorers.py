"""Module-level scorers for tests of worker processes (spawned workers import them by name).

Kept free of pytest and heavy imports so each worker starts quickly.
"""

import os
import time


def misbehaving(solution_str, ground_truth, extra_info=None):
    """Exact match, except that some responses make the scorer misbehave on purpose."""
    if solution_str == "hang":
        while True:  # a pure-Python infinite loop
            pass
    if solution_str == "sleep":
        time.sleep(3600)  # blocked in C: no Python-level interrupt would reach it
    if solution_str == "die":
        os._exit(7)  # the worker process disappears mid-chunk
    if solution_str == "boom":
        raise RuntimeError("scorer exploded")
    if solution_str == "exit":
        raise SystemExit(3)
    if solution_str == "unpicklable":
        return {"score": 1.0, "handle": lambda: None}
    return float(solution_str == ground_truth)


def with_extras(solution_str, ground_truth, extra_info=None):
    return {"score": float(solution_str == ground_truth), "length": len(solution_str), "pid": "same"}


def scaled(solution_str, ground_truth, extra_info=None, *, factor=1.0):
    return factor * len(solution_str)


def scaled_row(factor, text):
    """A `WorkerPool` function: fn(context, *row)."""
    return factor * len(text)


def worker_pid(solution_str, ground_truth, extra_info=None):
    return float(os.getpid())


def busy_ms(solution_str, ground_truth, extra_info=None, *, ms=1.0):
    """Exact match after about `ms` milliseconds of CPU work (a stand-in for a costly scorer)."""
    end = time.perf_counter() + ms / 1000
    while time.perf_counter() < end:
        pass
    return float(solution_str == ground_truth)


def _refuse_to_load():
    raise ImportError("this scorer cannot be loaded in another process")


class LoadsNowhere:
    """Pickles fine here, but unpickling it (in a worker) fails."""

    def __call__(self, solution_str, ground_truth, extra_info=None):
        return 1.0

    def __reduce__(self):
        return (_refuse_to_load, ())
