"""A kill while keep-last-N deletes an old checkpoint leaves nothing behind for good: the next start
removes the half-deleted remains, and they are never taken for a checkpoint (or kept aside as a
broken one)."""

import os
import signal
import subprocess
import sys
from pathlib import Path

from rlhf.trainers.checkpoint import CheckpointManager

HERE = Path(__file__).parent


def test_a_checkpoint_half_deleted_by_a_kill_is_cleaned_up_at_the_next_start(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parents[1]), str(HERE)])}
    proc = subprocess.run([sys.executable, str(HERE / "prune_job.py"), str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    manager = CheckpointManager(tmp_path, keep=1)
    manager.remove_partial()  # what a trainer does at its start
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000002"]
    folder, state, skipped = manager.resume(lambda folder: None)
    assert folder.name == "step_00000002" and state["note"] == "second" and skipped == []
