"""Folders that say when they were damaged: `MANIFEST.json` lists every file's size and sha256.

Written last, when every other file of a checkpoint or a model folder (`final/`, an export) is in
place; `verify` later finds what happened to the folder since (a truncated copy, a bad disk, a file
edited or deleted by hand) before anything trains from it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from rlhf.io.fingerprint import sha256_file

MANIFEST = "MANIFEST.json"

__all__ = ["MANIFEST", "damage", "verify", "write_manifest"]


def write_manifest(folder: Path) -> None:
    """`MANIFEST.json`: size and sha256 of every file below `folder` (call it after all other files)."""
    files = {}
    for root, _, names in os.walk(folder):
        for name in sorted(names):
            path = Path(root, name)
            rel = path.relative_to(folder).as_posix()
            if rel != MANIFEST:
                files[rel] = {"size": path.stat().st_size, "sha256": sha256_file(path)}
    (Path(folder) / MANIFEST).write_text(json.dumps({"algorithm": "sha256", "files": files}, indent=1,
                                                    sort_keys=True))


def verify(folder: Path) -> str | None:
    """None if every file the manifest lists is there with its size and checksum, else why not."""
    found = damage(folder)
    return None if found is None else found[1]


def damage(folder: Path) -> tuple[Path, str] | None:
    """The first damaged file (or the manifest itself) and what is wrong with it; None if intact."""
    folder = Path(folder)
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        files = manifest["files"]
    except FileNotFoundError:
        return folder / MANIFEST, f"it has no {MANIFEST} (not written by this version of rlhf, or not by rlhf)"
    except (OSError, ValueError, KeyError, TypeError) as err:
        return folder / MANIFEST, f"its {MANIFEST} is unreadable ({type(err).__name__}: {err})"
    for rel, expected in sorted(files.items()):
        path = folder / rel
        if not path.is_file():
            return path, f"{rel} is missing"
        size = path.stat().st_size
        if size != expected["size"]:
            return path, f"{rel} has {size} bytes, the manifest says {expected['size']} (truncated or replaced)"
        if sha256_file(path) != expected["sha256"]:
            return path, f"{rel} does not match its sha256 in the manifest (corrupted)"
    return None
