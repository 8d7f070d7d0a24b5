"""Reward scoring throughput: in-process vs a pool of worker processes, on GSM8K-style responses.

    python benchmarks/rewards.py [--n 4096] [--repeats 5] [--workers 2] [--slow-ms 1.0]

Two scorers: verl-style GSM8K (`gsm8k_score`, ~10 us a row, where shipping rows to other
processes costs more than scoring them) and the same with a fixed amount of CPU work added
per row, calibrated to `--slow-ms` of CPU time (a stand-in for a costly rule, e.g. symbolic
math), where N workers should approach N times the in-process throughput on N free cores.
Calls alternate between the two managers, so load from other processes hits both alike.
"""

from __future__ import annotations

import argparse
import functools
import os
import random
import statistics
import sys
import time

from rlhf.data import ground_truth, gsm8k_like_rows
from rlhf.rewards import RewardManager, gsm8k_score


def slow_gsm8k(solution_str: str, ground_truth: str, extra_info: dict | None = None, *, iterations: int) -> float:
    """`gsm8k_score` after a fixed amount of CPU work (`iterations` additions)."""
    total = 0
    for i in range(iterations):
        total += i
    return gsm8k_score(solution_str, ground_truth, extra_info)


def iterations_per_ms() -> int:
    """How many loop iterations of `slow_gsm8k` take one CPU millisecond here (CPU time, so
    other processes competing for the cores do not skew it)."""
    n, best = 200_000, float("inf")
    for _ in range(5):
        start = time.process_time()
        slow_gsm8k("", "0", iterations=n)
        best = min(best, time.process_time() - start)
    return int(n / (best * 1000))


def responses(n: int, seed: int = 0) -> tuple[list[str], list[str], list[str], list[dict]]:
    """n responses to generated GSM8K-format problems: a third correct, a third wrong, a third malformed."""
    rows = gsm8k_like_rows(n, seed=seed)
    rng = random.Random(seed)
    texts = []
    for i, row in enumerate(rows):
        solution, answer = row["extra_info"]["answer"], ground_truth(row)
        kind = i % 3
        if kind == 0:
            texts.append(solution)
        elif kind == 1:
            texts.append(solution.rsplit("####", 1)[0] + f"#### {int(answer) + rng.randint(1, 9)}")
        else:
            texts.append(rng.choice([solution.rsplit("####", 1)[0], "I don't know.", solution[: len(solution) // 2]]))
    return texts, [r["data_source"] for r in rows], [ground_truth(r) for r in rows], [r["extra_info"] for r in rows]


def timed(manager: RewardManager, args: tuple) -> tuple[float, float]:
    """(samples per second, CPU seconds this process used per wall second) of one call."""
    start, cpu = time.perf_counter(), time.process_time()
    manager(*args)
    wall = time.perf_counter() - start
    return len(args[0]) / wall, (time.process_time() - cpu) / wall


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=4096, help="responses scored per call")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per manager (median reported)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes of the parallel manager")
    parser.add_argument("--slow-ms", type=float, default=1.0, help="CPU milliseconds per row of the slow scorer")
    args = parser.parse_args(argv)
    if "torch" in sys.modules:
        import torch

        torch.set_num_threads(1)
    data = responses(args.n)
    slow = functools.partial(slow_gsm8k, iterations=int(args.slow_ms * iterations_per_ms()))
    print(f"{args.n} GSM8K-style responses; {args.repeats} timed calls per manager, alternating in-process and "
          f"parallel calls; {os.cpu_count()} CPUs, load average before {os.getloadavg()[0]:.2f}")
    print(f"{'scorer':<20} {'manager':<11} {'median/s':>9}  {'runs (samples/s)':<40} {'ratio':>6}")
    for name, scorer in (("gsm8k_score", gsm8k_score), (f"gsm8k + {args.slow_ms:g} ms CPU", slow)):
        scorers = {"openai/gsm8k": scorer}
        sequential = RewardManager(scorers)
        with RewardManager(scorers, num_workers=args.workers) as parallel:
            start = time.perf_counter()
            assert parallel(*data) == sequential(*data), "parallel scoring must match in-process scoring"
            startup = time.perf_counter() - start  # includes starting the pool
            runs: dict[str, list[float]] = {"in-process": [], f"{args.workers} workers": []}
            shares = []
            for _ in range(args.repeats):  # alternate, so load from other processes hits both alike
                rate, share = timed(sequential, data)
                runs["in-process"].append(rate)
                shares.append(share)
                runs[f"{args.workers} workers"].append(timed(parallel, data)[0])
        base = statistics.median(runs["in-process"])
        for label, rates in runs.items():
            rate = statistics.median(rates)
            listed = " ".join(f"{r:.0f}" for r in rates)
            print(f"{name:<20} {label:<11} {rate:>9.0f}  {listed:<40} {rate / base:>5.2f}x")
        print(f"{'':<20} (first parallel call incl. pool start, plus one in-process call: {startup:.2f} s; "
              f"the in-process calls got {statistics.median(shares):.2f} of a core)")
    print(f"load average after {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":  # required: worker processes are spawned and re-import this file
    sys.exit(main())
