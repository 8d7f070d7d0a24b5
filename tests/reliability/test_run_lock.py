"""One job per run folder: a second job started under the same run name while the first runs is
refused at once, naming the holder; a holder that was killed leaves nothing that blocks."""

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import fiddle as fdl
import pytest

from rlhf.runtime.experiment import Experiment, run_experiment
from rlhf.runtime.run_lock import RunFolderInUse
from identity_toys import CountStage, WaitStage

HERE = Path(__file__).parent
ROOT = HERE.parents[1]


def waiting_graph(out: Path) -> fdl.Config:
    return fdl.Config(Experiment, name="toy", output_dir=str(out), run_name="job", progress=False,
                      stages={"wait": fdl.Config(WaitStage)})


def start_holder(out: Path) -> subprocess.Popen:
    """A job (its own process) that holds run `toy/job` until its stage folder gets a `release` file."""
    code = textwrap.dedent(f"""
        import torch; torch.set_num_threads(1)
        from test_run_lock import waiting_graph
        from rlhf.runtime.experiment import run_experiment
        from pathlib import Path
        run_experiment(waiting_graph(Path({str(out)!r})))
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(HERE)])}
    proc = subprocess.Popen([sys.executable, "-c", code, "--holder-marker"], env=env, stderr=subprocess.PIPE, text=True)
    started = out / "toy" / "job" / "wait" / "started"
    deadline = time.monotonic() + 120
    while not started.exists():
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline, "the holder job did not start its stage"
        time.sleep(0.05)
    return proc


def test_a_second_job_on_a_running_run_name_is_refused_at_once_naming_the_holder(tmp_path):
    holder = start_holder(tmp_path)
    try:
        t0 = time.monotonic()
        with pytest.raises(RunFolderInUse) as err:
            run_experiment(waiting_graph(tmp_path))
        assert time.monotonic() - t0 < 10  # refused, not queued behind the holder
        message = str(err.value)
        assert str(tmp_path / "toy" / "job") in message
        assert f"pid {holder.pid}" in message and socket.gethostname() in message
        assert "--holder-marker" in message  # the holder's command line
        assert "started 20" in message  # its start time (an ISO date)
        assert "set:run_name=" in message  # how to run beside it
        (tmp_path / "toy" / "job" / "wait" / "release").write_text("")
        assert holder.wait(timeout=60) == 0, holder.stderr.read()
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    # the run is free again once the holder ended
    assert run_experiment(waiting_graph(tmp_path))["wait"]["metrics"] == {"waited": 1.0}


def test_a_killed_holder_does_not_block_the_next_job(tmp_path):
    holder = start_holder(tmp_path)
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait(timeout=30)
    (tmp_path / "toy" / "job" / "wait" / "release").write_text("")
    t0 = time.monotonic()
    assert run_experiment(waiting_graph(tmp_path))["wait"]["metrics"] == {"waited": 1.0}
    assert time.monotonic() - t0 < 30


def test_jobs_under_other_run_names_run_side_by_side(tmp_path):
    holder = start_holder(tmp_path)
    try:
        other = fdl.Config(Experiment, name="toy", output_dir=str(tmp_path), run_name="job-2", progress=False,
                           stages={"count": fdl.Config(CountStage, steps=2)})
        assert run_experiment(other)["count"]["metrics"] == {"steps": 2.0}
    finally:
        (tmp_path / "toy" / "job" / "wait" / "release").write_text("")
        holder.wait(timeout=60)
