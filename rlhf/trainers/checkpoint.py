"""Checkpoints that never lie: atomic `step_XXXXXXXX` folders with a manifest, keep-last-N, and a
resume that falls back to the newest intact checkpoint.

A checkpoint folder holds each worker group's state (weights, optimizer, LR schedule, every
rank's RNG states), the driver's `trainer_state.json` (step, KL controller), and, written last,
`MANIFEST.json`: every other file's size and sha256. The folder is written under a temporary
name, fsynced and renamed, so a crash or a full disk mid-write leaves the previous checkpoint
intact and a folder named `step_*` is always complete when written. What happens to it later
(a truncated copy, a bad disk, a file edited or deleted by hand) the manifest catches:
`resume(load)` verifies the newest checkpoint, and if it is broken (or fails to load) moves it
aside to `step_XXXXXXXX.broken-<time>` (never deleted: it is evidence), warns naming it and why,
and tries the next older one; with none intact the stage starts from its beginning.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlhf.io.atomic import atomic_write_dir
from rlhf.io.fingerprint import sha256_file
from rlhf.io.manifest import MANIFEST, verify, write_manifest
from rlhf.workers.state_io import CheckpointFormatError

STATE_FILE = "trainer_state.json"
_STEP = re.compile(r"^step_(\d{8})$")

log = logging.getLogger(__name__)

__all__ = ["MANIFEST", "CheckpointError", "CheckpointManager", "sha256_file", "verify", "write_manifest"]


class CheckpointError(RuntimeError):
    """A checkpoint could not be written or read; the message says which and what is intact."""


class CheckpointManager:
    """One stage's checkpoint folder. The trainer that owns it calls `remove_partial` at start."""

    def __init__(self, root: Path, keep: int = 2):
        if keep < 1:
            raise ValueError(f"keep must be >= 1 (checkpoints to keep), got {keep}")
        self.root = Path(root)
        self.keep = keep

    def remove_partial(self) -> None:
        """Delete temporary folders of writes that never finished (a kill or crash mid-save)."""
        if self.root.exists():
            for p in self.root.iterdir():
                if p.name.startswith(".step_") and (".tmp-" in p.name or ".old-" in p.name):
                    shutil.rmtree(p, ignore_errors=True)

    def complete(self) -> list[Path]:
        """Complete checkpoints, oldest first."""
        if not self.root.exists():
            return []
        found = [p for p in self.root.iterdir() if _STEP.match(p.name) and (p / STATE_FILE).exists()]
        return sorted(found, key=lambda p: int(_STEP.match(p.name).group(1)))

    def _step_folders(self) -> list[Path]:
        if not self.root.exists():
            return []
        found = [p for p in self.root.iterdir() if _STEP.match(p.name) and p.is_dir()]
        return sorted(found, key=lambda p: int(_STEP.match(p.name).group(1)))

    def latest(self) -> Path | None:
        done = self.complete()
        return done[-1] if done else None

    def save(self, step: int, write_parts: Callable[[Path], None], state: dict[str, Any]) -> Path:
        """Write a checkpoint: `write_parts(folder)` fills it (worker states), then the driver state."""
        target = self.root / f"step_{step:08d}"

        def write(folder: Path) -> None:
            write_parts(folder)
            (folder / STATE_FILE).write_text(json.dumps({**state, "step": step}, indent=1, default=str))
            write_manifest(folder)  # last: a folder with a manifest had every other file written

        try:
            atomic_write_dir(str(target), write)
        except Exception as err:
            previous = self.latest()
            kept = f"the previous checkpoint {previous} is intact" if previous else "no earlier checkpoint exists"
            raise CheckpointError(
                f"could not write checkpoint {target} ({_reason(err)}); {kept}. "
                "Free disk space or point the experiment's output_dir elsewhere, then resume."
            ) from err
        for old in self.complete()[: -self.keep]:
            _delete(old)
        return target

    def resume(self, load: Callable[[Path], None]) -> tuple[Path | None, dict[str, Any], list[str]]:
        """Load the newest intact checkpoint with `load(folder)`.

        Returns (the folder, its trainer state, one line per checkpoint skipped and why); (None,
        {"step": 0}, skipped) when none is intact, so the stage starts from its beginning. A
        checkpoint that fails verification or `load` is moved aside (`.broken-<time>`) and
        logged as a warning: a later save of the same step must not overwrite it, and keep-last-N
        must not count or delete it. A `CheckpointFormatError` (a format this configuration cannot
        read, e.g. Accelerate's former format under FSDP) stops the resume instead: the checkpoint is
        intact, and falling back would silently start the stage over.
        """
        skipped: list[str] = []
        for folder in reversed(self._step_folders()):  # with or without a state file: a missing one is reported
            reason = verify(folder)
            state: dict[str, Any] = {}
            if reason is None:
                try:
                    state = self.read_state(folder)
                    load(folder)
                except CheckpointFormatError:  # not broken, just unreadable here: falling back would lose the run
                    raise
                except Exception as err:  # noqa: BLE001 - any failure to load means: try the one before
                    reason = f"loading it failed ({_reason(err)})"
            if reason is None:
                if skipped:
                    log.warning("resuming from %s after skipping %d broken checkpoint(s)", folder, len(skipped))
                return folder, state, skipped
            aside = folder.with_name(f"{folder.name}.broken-{datetime.datetime.now():%Y%m%d-%H%M%S}")
            os.rename(folder, aside)
            line = f"skipped checkpoint {folder} because {reason}; moved it to {aside.name} (not deleted)"
            log.warning("%s", line)
            skipped.append(line)
        if skipped:
            log.warning("no intact checkpoint in %s: starting the stage from its beginning", self.root)
        return None, {"step": 0}, skipped

    @staticmethod
    def read_state(folder: Path) -> dict[str, Any]:
        try:
            return json.loads((Path(folder) / STATE_FILE).read_text())
        except (OSError, ValueError) as err:
            raise CheckpointError(f"checkpoint {folder} has no readable {STATE_FILE}: {err}") from err


def _delete(folder: Path) -> None:
    """Delete a checkpoint by renaming it to `.step_*.old-<pid>` first: a kill mid-delete leaves a folder that
    `remove_partial` removes at the next start, never a half-deleted `step_*` folder taken for a checkpoint."""
    doomed = folder.with_name(f".{folder.name}.old-{os.getpid()}")
    try:
        os.rename(folder, doomed)
    except OSError:  # gone already, or not ours to rename: leave it as it is
        return
    shutil.rmtree(doomed, ignore_errors=True)


def _reason(err: BaseException) -> str:
    """`Type: first line` of an error; a worker's error under Ray (a `RayTaskError`, whose text is the
    remote traceback) is described by the exception it wraps (`cause`)."""
    cause = getattr(err, "cause", None)
    err = cause if isinstance(cause, BaseException) else err
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0][:300] if text else ''}"
