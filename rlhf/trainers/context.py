"""What a stage receives from the experiment runner: where to write, how to log, its seed.

Trainers never open tracking runs themselves; they call `log`/`record` and the runner routes
those to the stage's Aim run (and anything else that listens).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any


def _ignore(*_: Any, **__: Any) -> None:
    return None


@dataclasses.dataclass
class StageContext:
    out_dir: Path  # this stage's folder for checkpoints and records
    log: Callable[[Mapping[str, float], int], None] = _ignore  # metrics at a step
    record: Callable[[Mapping[str, Any]], None] = _ignore  # run params (e.g. data fingerprints)
    name: str = "stage"
    progress: bool = True  # show a progress bar on the console
    resume: bool = False  # continue from the newest complete checkpoint in out_dir, if any
