"""What a file or folder holds, as one short string: its size and sha256 (a run's data is part of its identity).

`content_fingerprint(path)` reads every byte once per process and remembers the digest by the
file's identity on disk (device, inode, size, modification time in ns): a named run compares its
data files at every rerun, and a multi-gigabyte file is not read again while it is unchanged.
Across processes, `file_stat(path)` and a fingerprint recorded with it let the caller skip the
read of a file whose size and modification time have not changed (`content_fingerprint(path,
known=...)`). As git does with its index, a file modified in the last 2 seconds is never taken
as unchanged by its stat: modification times advance in clock ticks, so a same-size rewrite
within one tick would look the same.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Sequence
from pathlib import Path

__all__ = ["content_fingerprint", "file_stat", "sha256_file", "stat_digest"]

_CHUNK = 8 * 2**20
_SETTLED_NS = 2 * 10**9  # a file modified longer ago than this can be recognised by its stat
_memo: dict[tuple, str] = {}


def _settled(stat: os.stat_result) -> bool:
    return time.time_ns() - stat.st_mtime_ns > _SETTLED_NS


def sha256_file(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def stat_digest(folders: Sequence[str | os.PathLike], prefix: str = "") -> str:
    """sha256 (hex) of `prefix` and the name, size and modification time of every file directly in `folders`:
    a cache key that is cheap (no file is read) and changes whenever a file is rewritten, unlike
    `content_fingerprint`, which reads every byte."""
    digest = hashlib.sha256(prefix.encode())
    for folder in folders:
        for item in sorted(Path(folder).iterdir()):
            if item.is_file():
                stat = item.stat()
                digest.update(f"{item.name}:{stat.st_size}:{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def _file_digest(path: Path) -> tuple[int, str]:
    stat = path.stat()
    key = (str(path.resolve()), stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)
    if key in _memo:
        return stat.st_size, _memo[key]
    digest = sha256_file(path)
    if _settled(stat):
        _memo[key] = digest
    return stat.st_size, digest


def file_stat(path: str | os.PathLike) -> list[int] | None:
    """[size, modification time in ns] of a file; None for a folder, nothing, or a file modified in the last
    2 seconds (its stat cannot vouch for its contents yet)."""
    path = Path(path).expanduser()
    if not path.is_file():
        return None
    stat = path.stat()
    return [stat.st_size, stat.st_mtime_ns] if _settled(stat) else None


def content_fingerprint(path: str | os.PathLike, known: tuple[list[int], str] | None = None) -> str:
    """`"<size> bytes, sha256 <first 16 hex digits>"` of a file; for a folder, of every file below it
    (names included, `"<n> files, ..."`); `"missing"` when there is nothing at `path`.

    `known`: (`file_stat` then, the fingerprint then) recorded earlier; returned as it is, without
    reading the file, while the file's size and modification time are the same.
    """
    path = Path(path).expanduser()
    if known is not None and known[0] is not None and file_stat(path) == list(known[0]):
        return known[1]
    if path.is_file():
        size, digest = _file_digest(path)
        return f"{size} bytes, sha256 {digest[:16]}"
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file())
        total, digest = 0, hashlib.sha256()
        for file in files:
            size, file_digest = _file_digest(file)
            total += size
            digest.update(f"{file.relative_to(path).as_posix()}\0{file_digest}\n".encode())
        return f"{len(files)} files, {total} bytes, sha256 {digest.hexdigest()[:16]}"
    return "missing"
