"""When the driver is stopped (Ctrl-C, SIGTERM) while it waits on its workers, the Ray cluster it
started goes with it, the stage's Aim run is closed as interrupted, and the command says so in one
line. A terminal's Ctrl-C and `timeout` signal the whole process group, Ray's daemons included:
stopping then used to wait 60 s for a dead GCS and print "Failed to connect to GCS"."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from rlhf.tracking.query import find_runs

JOB = Path(__file__).with_name("ray_exit_job.py")
# The job ends as the command line does (rlhf.cli.errors): one line, then it ends by the signal it got.
CASES = {  # name: (job mode, signal sent once the stage runs, to the whole process group?, exit status, Aim status)
    "SIGTERM": ("wait", signal.SIGTERM, False, -signal.SIGTERM, "interrupted"),  # `kill PID`, a scheduler
    "SIGTERM-group": ("wait", signal.SIGTERM, True, -signal.SIGTERM, "interrupted"),  # `timeout`
    "SIGINT-group": ("wait", signal.SIGINT, True, -signal.SIGINT, "interrupted"),  # Ctrl-C in a terminal
}
# An exception in a stage and a normal end leave through the same `finally` (RayRuntime.shutdown)
# that Ctrl-C does; run this job with mode "raise" or "finish" to see it. Each case here is mostly
# Ray's start-up (~5 s idle, ~15 s on a loaded 2-core machine), so CI runs the two at once.


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.slow
def test_a_stopped_driver_shuts_down_the_ray_cluster_it_started(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(JOB.parent), str(JOB.parents[2]), os.environ.get("PYTHONPATH", "")])}
    jobs = {  # all at once: each is mostly Ray's start-up
        name: subprocess.Popen([sys.executable, str(JOB), str(tmp_path / name), mode], env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        for name, (mode, *_) in CASES.items()
    }
    try:
        helpers = {}
        for name, proc in jobs.items():
            line = proc.stdout.readline()
            assert line, f"{name}: the job ended before its stage ran:\n{proc.stderr.read()[-3000:]}"
            helpers[name] = json.loads(line)["pids"]
            assert len(helpers[name]) >= 3, helpers[name]  # GCS, raylet, the worker actor, ...
        time.sleep(0.5)  # into the blocking ray.get
        sent = {}
        for name, proc in jobs.items():
            _, sig, group, *_ = CASES[name]
            os.killpg(proc.pid, sig) if group else proc.send_signal(sig)  # the job leads its own group
            sent[name] = time.monotonic()
        for name, proc in jobs.items():
            _, err = proc.communicate(timeout=120)
            took = time.monotonic() - sent[name]
            assert proc.returncode == CASES[name][3], f"{name}: exit {proc.returncode}\n{err[-3000:]}"
            assert took < 30 and "Failed to connect to GCS" not in err, f"{name}: {took:.0f} s\n{err[-3000:]}"
            assert "Traceback" not in err, f"{name}:\n{err[-3000:]}"
            signame = "SIGTERM" if CASES[name][1] == signal.SIGTERM else "Ctrl-C (SIGINT)"
            assert err.strip().splitlines()[-1] == f"interrupted by {signame}; stopped cleanly.", err[-1000:]
        deadline = time.monotonic() + 15
        while any(alive(p) for pids in helpers.values() for p in pids) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = {name: [psutil.Process(p).name() for p in pids if alive(p)] for name, pids in helpers.items()}
        assert left == {name: [] for name in CASES}, f"Ray processes outlived their driver: {left}"
        for name, (*_, status) in CASES.items():
            (run,) = find_runs(str(tmp_path / name), experiment="exit")
            assert run["params"]["status"] == status, name
    finally:
        for proc in jobs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
