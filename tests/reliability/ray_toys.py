"""A worker and a stage for the driver-exit tests (importable by Ray actors through PYTHONPATH)."""

import json
import sys
import time

import psutil

from rlhf.workers.dispatch import on_all_ranks


class SleepWorker:
    @on_all_ranks
    def sleep(self, seconds: float) -> float:
        time.sleep(seconds)
        return seconds


class PidWorker:
    @on_all_ranks
    def pid(self) -> int:
        import os

        return os.getpid()


class ReportThenStage:
    """Prints the driver's descendant processes (Ray's daemons and workers), then waits, fails or ends."""

    def __init__(self, group, mode: str = "wait"):
        self.group, self.mode = group, mode

    def run(self, ctx):
        self.group.sleep(0.0)  # the actor is up
        pids = [p.pid for p in psutil.Process().children(recursive=True)]
        print(json.dumps({"pids": pids}), flush=True)
        if self.mode == "raise":
            raise RuntimeError("injected failure in the stage")
        if self.mode == "wait":
            self.group.sleep(120.0)  # the driver blocks in ray.get until a signal arrives
        return {"metrics": {}}


if __name__ == "__main__":
    sys.exit("imported by ray_exit_job.py")
