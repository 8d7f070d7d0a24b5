"""Checkpoints that never lie: atomic `step_XXXXXXXX` folders, keep-last-N, newest-complete lookup.

A checkpoint folder holds each worker group's Accelerate state (weights, optimizer, LR
schedule, every rank's RNG states) and the driver's `trainer_state.json` (step, data
position, KL controller, tracking run). It is written under a temporary name, fsynced and
renamed, so a crash or a full disk mid-write leaves the previous checkpoint intact and a
folder named `step_*` is always complete.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlhf.workers.training import atomic_write_dir

STATE_FILE = "trainer_state.json"
_STEP = re.compile(r"^step_(\d{8})$")


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

    def latest(self) -> Path | None:
        done = self.complete()
        return done[-1] if done else None

    def save(self, step: int, write_parts: Callable[[Path], None], state: dict[str, Any]) -> Path:
        """Write a checkpoint: `write_parts(folder)` fills it (worker states), then the driver state."""
        target = self.root / f"step_{step:08d}"

        def write(folder: Path) -> None:
            write_parts(folder)
            (folder / STATE_FILE).write_text(json.dumps({**state, "step": step}, indent=1, default=str))

        try:
            atomic_write_dir(str(target), write)
        except Exception as err:
            previous = self.latest()
            kept = f"the previous checkpoint {previous} is intact" if previous else "no earlier checkpoint exists"
            raise CheckpointError(
                f"could not write checkpoint {target} ({type(err).__name__}: {err}); {kept}. "
                "Free disk space or point the experiment's output_dir elsewhere, then resume."
            ) from err
        for old in self.complete()[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        return target

    @staticmethod
    def read_state(folder: Path) -> dict[str, Any]:
        try:
            return json.loads((Path(folder) / STATE_FILE).read_text())
        except (OSError, ValueError) as err:
            raise CheckpointError(f"checkpoint {folder} has no readable {STATE_FILE}: {err}") from err
