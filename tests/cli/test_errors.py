"""A command that stops for a reason it can explain ends with one line, not a traceback (rlhf.cli.errors)."""

import errno

import pytest

from rlhf.cli.errors import one_line_errors
from rlhf.data.schema import DataError
from rlhf.trainers.checkpoint import CheckpointError


class RemoteError(RuntimeError):
    """What Ray hands the driver for a worker's error: its text is the remote traceback, `cause` the error."""

    def __init__(self, cause):
        super().__init__("Traceback (most recent call last):\n  File ...\n" + str(cause))
        self.cause = cause


def raising(err):
    def raise_it():
        raise err

    return raise_it


def disk_full():
    try:
        raise OSError(errno.ENOSPC, "No space left on device", "/out/rollouts.jsonl")
    except OSError as err:
        raise RuntimeError("while writing the records") from err


@pytest.mark.parametrize("raise_it, line", [
    (raising(CheckpointError("could not write checkpoint /o/step_3 (...); then resume.")),
     "error: could not write checkpoint /o/step_3 (...); then resume."),
    (raising(RemoteError(DataError("data.jsonl: row 3 has no prompt"))), "error: data.jsonl: row 3 has no prompt"),
    (disk_full, "error: no space left on the device (writing /out/rollouts.jsonl). Free disk space or point the "
                "experiment's output_dir elsewhere. Run it again."),
], ids=["explained", "explained-from-a-worker", "disk-full-anywhere-in-the-chain"])
def test_an_explained_error_or_a_full_disk_is_one_line(raise_it, line):
    with pytest.raises(SystemExit) as exit_:
        with one_line_errors("run it again"):
            raise_it()
    assert exit_.value.code == line


def test_anything_else_keeps_its_traceback():
    with pytest.raises(ZeroDivisionError):
        with one_line_errors():
            1 / 0


def test_ctrl_c_in_a_run_is_one_line_and_ends_by_the_signal(tmp_path):
    """`rlhf run x.py` stopped with Ctrl-C printed a 112-line traceback; now one line that says how to resume,
    and the process ends by SIGINT (what a shell or a script checks)."""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    experiment = Path(__file__).with_name("sleepy_experiment.py")
    argv = ["run", str(experiment), "--config", f"config:base(out={str(tmp_path)!r})"]
    code = f"from rlhf.cli import main; main({argv!r})"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2])])})
    assert proc.stdout.readline().strip() == "running", proc.communicate()[1][-2000:]
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGINT
    assert err.strip().splitlines() == ["interrupted by Ctrl-C (SIGINT); stopped cleanly. Run the same command again "
                                        "to resume from the newest checkpoint."], err
