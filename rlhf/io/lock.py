"""Inter-process locks: one helper for every "only one process at a time here".

The locks are the operating system's (`flock`): they are released when the process that holds them
ends, however it ends (a SIGKILL included), so a lock left by a dead process never blocks anyone.
A lock file (`filelock`) stays behind, empty; its presence means nothing. `held_folder` locks a
folder itself instead, leaving no file (for a folder other programs own, like an Aim repository's).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from filelock import FileLock, Timeout

__all__ = ["held", "held_folder", "try_hold"]

log = logging.getLogger(__name__)


@contextlib.contextmanager
def held(path: Path) -> Iterator[None]:
    """Wait for the lock at `path` (created with its folder if absent) and hold it for the block."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path)):
        yield


def try_hold(path: Path) -> FileLock | None:
    """The lock at `path`, now held by this process (release it with `.release()`), or None when
    another process holds it: never waits."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(path), timeout=0)
    try:
        lock.acquire()
    except Timeout:
        return None
    return lock


@contextlib.contextmanager
def held_folder(folder: Path) -> Iterator[None]:
    """Wait for a lock on `folder` itself and hold it for the block; where the filesystem cannot lock
    folders, go on unlocked (with a debug line), as without this helper."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as err:
            log.debug("cannot lock %s (%s); going on without a lock", folder, err)
        yield
    finally:
        os.close(fd)  # releases the lock
