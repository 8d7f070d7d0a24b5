"""Inter-process locks on files: one helper, on `filelock`, for every "only one process at a time here".

The locks are the operating system's (`flock`): they are released when the process that holds them
ends, however it ends (a SIGKILL included), so a lock left by a dead process never blocks anyone.
The lock file itself stays behind, empty; its presence means nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from filelock import FileLock, Timeout

__all__ = ["held", "try_hold"]


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
