"""Writes two checkpoints with keep=1 and is SIGKILLed while the first is being deleted (after its
first file went): the state a kill during keep-last-N pruning leaves. Run by test_prune_kill.py."""

import os
import shutil
import signal
import sys
from pathlib import Path

from rlhf.trainers.checkpoint import CheckpointManager


def write_weights(folder: Path) -> None:
    (folder / "weights.bin").write_bytes(os.urandom(4096))


def delete_one_file_then_die(path, *args, **kwargs):
    """shutil.rmtree, interrupted by a SIGKILL after one file when it deletes checkpoint 1."""
    files = sorted(p for p in Path(path).rglob("*") if p.is_file())
    if "step_00000001" not in Path(path).name or not files:
        return REAL_RMTREE(path, *args, **kwargs)
    files[0].unlink()
    os.kill(os.getpid(), signal.SIGKILL)


REAL_RMTREE = shutil.rmtree


if __name__ == "__main__":
    manager = CheckpointManager(Path(sys.argv[1]), keep=1)
    manager.save(1, write_weights, {"note": "first"})
    shutil.rmtree = delete_one_file_then_die  # the kill lands in the middle of pruning checkpoint 1
    manager.save(2, write_weights, {"note": "second"})
    sys.exit("not reached: pruning should have been interrupted")
