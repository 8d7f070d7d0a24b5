"""Folders written whole or not at all: checkpoints, exported models, adapters.

`atomic_write_dir(path, write)` lets `write` fill a temporary folder beside `path`, fsyncs
every file, and renames it into place, so a crash or a full disk mid-write leaves the previous
folder intact and a folder with the final name is always complete.

The folder and its files get the modes the process's umask gives (`apply_umask`): the temporary
folder is made by `mkdtemp` (always 0700) and safetensors writes its files 0600, so without it a
checkpoint or exported model would be private to its writer whatever the umask says.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

__all__ = ["apply_umask", "atomic_write_dir", "fsync_tree"]


def atomic_write_dir(path: str, write: Callable[[Path], None]) -> None:
    """Write a folder under a temporary name, fsync its files, then rename it into place.

    A crash (or a full disk) mid-write leaves any previous folder at `path` intact.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        write(tmp)
        apply_umask(tmp)
        fsync_tree(tmp)
        old = None
        if target.exists():
            old = target.with_name(f".{target.name}.old-{os.getpid()}")
            os.rename(target, old)
        os.rename(tmp, target)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        _fsync_dir(target.parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def apply_umask(folder: Path) -> None:
    """Give `folder`, its sub-folders and files the modes a plain `mkdir` / `open` would under this umask
    (0777 / 0666 minus the umask; a file's execute bits are kept where the umask allows them)."""
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(folder, 0o777 & ~mask)
    for root, dirs, files in os.walk(folder):
        for name in dirs:
            os.chmod(os.path.join(root, name), 0o777 & ~mask)
        for name in files:
            path = os.path.join(root, name)
            executable = os.stat(path).st_mode & 0o111
            os.chmod(path, (0o666 | executable) & ~mask)


def fsync_tree(folder: Path) -> None:
    for root, _, files in os.walk(folder):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(Path(root))


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
