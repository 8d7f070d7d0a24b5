"""One job at a time in a run folder.

Two jobs started with the same run name (the same command twice, or a rerun while the first still
runs) would both resume the same checkpoints and append their steps to the same records: steps
1,2,3,1,2,4... in one folder, both exiting 0. The runner holds `<run folder>/.run.lock` for the
whole job (`rlhf.io.lock`: released by the operating system when the job ends, also by SIGKILL),
and writes who holds it to `.run.lock.json`, so a second job is refused at once saying who it is.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import shlex
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

from rlhf.io.lock import try_hold

LOCK = ".run.lock"
HOLDER = ".run.lock.json"  # pid, host, start time and command of the job holding the lock


class RunFolderInUse(RuntimeError):
    """Another job holds the run folder; the message names it and how to go on."""


@contextlib.contextmanager
def run_folder_lock(folder: Path) -> Iterator[None]:
    """Hold `folder`'s run lock for the block, or raise `RunFolderInUse` at once naming the holder."""
    lock = try_hold(folder / LOCK)
    if lock is None:
        raise RunFolderInUse(_in_use_message(folder))
    try:
        _write_holder(folder / HOLDER)
        yield
    finally:
        lock.release()


def _write_holder(path: Path) -> None:
    holder = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": shlex.join(sys.argv),
    }
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(holder))
    os.replace(tmp, path)  # a reader sees the old holder or this one, never half of one


def _in_use_message(folder: Path) -> str:
    try:
        h = json.loads((folder / HOLDER).read_text())
        who = f"pid {h['pid']} on {h['host']}, started {h['started']}, command: {h['command']}"
    except (OSError, ValueError, KeyError):  # the holder has just taken the lock and not yet said who it is
        who = "a job that is just starting (its details are not written yet)"
    return (f"the run folder {folder} is in use by another job: {who}. Wait for it to end (or stop it), "
            f"or run this job beside it under another run name (e.g. set:run_name='{folder.name}-2').")
