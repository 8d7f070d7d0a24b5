"""What a file or folder holds, as one short string: its size and sha256 (a run's data is part of its identity).

`content_fingerprint(path)` reads every byte once per process and remembers the digest by the
file's identity on disk (device, inode, size, modification time in ns): a named run compares its
data files at every rerun, and a multi-gigabyte file is not read again while it is unchanged.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

__all__ = ["content_fingerprint", "sha256_file"]

_CHUNK = 8 * 2**20
_memo: dict[tuple, str] = {}


def sha256_file(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _file_digest(path: Path) -> tuple[int, str]:
    stat = path.stat()
    key = (str(path.resolve()), stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)
    if key not in _memo:
        _memo[key] = sha256_file(path)
    return stat.st_size, _memo[key]


def content_fingerprint(path: str | os.PathLike) -> str:
    """`"<size> bytes, sha256 <first 16 hex digits>"` of a file; for a folder, of every file below it
    (names included, `"<n> files, ..."`); `"missing"` when there is nothing at `path`."""
    path = Path(path).expanduser()
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
