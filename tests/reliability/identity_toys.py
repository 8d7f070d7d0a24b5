"""Small real stages for the run-identity tests: they write files, so a rerun that works shows."""

import os
from pathlib import Path

from rlhf.ranges import PositiveInt


class CountStage:
    """Appends one line per step to `steps.txt`, continuing after the lines already there."""

    def __init__(self, steps: PositiveInt = 2, label: str = "a"):
        self.steps, self.label = steps, label

    def run(self, ctx):
        ctx.out_dir.mkdir(parents=True, exist_ok=True)
        path = ctx.out_dir / "steps.txt"
        done = path.read_text().splitlines() if path.exists() else []
        with path.open("a") as f:
            for step in range(len(done) + 1, self.steps + 1):
                if os.environ.get("COUNT_FAIL_AT") == str(step):  # what a kill or a crash at this step leaves
                    raise RuntimeError(f"injected failure at step {step}")
                f.write(f"{self.label}{step}\n")
                f.flush()
        return {"checkpoint": str(path), "metrics": {"steps": float(self.steps)}}


class OtherCountStage(CountStage):
    """The same interface, another algorithm (a component of another kind)."""


class ReadStage:
    def __init__(self, checkpoint: str):
        self.checkpoint = checkpoint

    def run(self, ctx):
        return {"metrics": {"lines": float(len(Path(self.checkpoint).read_text().splitlines()))}}


class RowsStage:
    """Reads its rows (a data loader in the graph) and reports how many it trained on."""

    def __init__(self, rows):
        self.rows = rows

    def run(self, ctx):
        return {"metrics": {"rows": float(len(self.rows))}}


class WaitStage:
    """Writes `started` in its folder, then waits until a file `release` appears there (a job that is
    still running when a second one starts under the same run name)."""

    def __init__(self, timeout_s: float = 120.0):
        self.timeout_s = timeout_s

    def run(self, ctx):
        import time

        ctx.out_dir.mkdir(parents=True, exist_ok=True)
        (ctx.out_dir / "started").write_text(str(os.getpid()))
        deadline = time.monotonic() + self.timeout_s
        while not (ctx.out_dir / "release").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        return {"metrics": {"waited": 1.0}}


def broken_scorer(solution_str, ground_truth, extra_info=None) -> float:
    """A reward scorer that fails on every row (a strict RewardManager stops the run with a ScorerError)."""
    raise RuntimeError("scorer exploded")
