"""Working folders of the learning benchmarks: logs stay, weights go.

A SmolLM2 benchmark writes a checkpoint per stage (0.5 GB of weights, 1.5 GB with optimiser state);
a few runs left in the temporary folder filled a 250 GB disk and failed a CI run after them. After
its JSON is written, a benchmark prunes its working folder to what a reader of the result needs
(logs, rollouts, metrics); set RLHF_BENCH_KEEP_WEIGHTS=1 to keep the checkpoints for inspection.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

WEIGHT_SUFFIXES = (".safetensors", ".distcp", ".pt", ".bin")
KEEP_ENV = "RLHF_BENCH_KEEP_WEIGHTS"


def prune_weights(folder: str | Path) -> int:
    """Delete weight and checkpoint files under `folder` (unless RLHF_BENCH_KEEP_WEIGHTS=1); bytes freed.

    A checkpoint folder left without weights is removed whole, so no half checkpoint looks loadable.
    """
    folder = Path(folder)
    if os.environ.get(KEEP_ENV) == "1" or not folder.is_dir():
        return 0
    freed = 0
    for path in list(folder.rglob("*")):
        if path.is_file() and path.suffix in WEIGHT_SUFFIXES:
            freed += path.stat().st_size
            path.unlink()
    for name in ("step_*", "best", "final"):
        for ckpt in list(folder.rglob(name)):
            if ckpt.is_dir():
                shutil.rmtree(ckpt, ignore_errors=True)
    return freed


def report_pruned(folder: str | Path) -> None:
    """Prune `folder` and say so in one line (what went, how to keep it next time)."""
    freed = prune_weights(folder)
    if freed:
        print(f"removed {freed / 2**30:.1f} GiB of checkpoints from {folder} (logs kept; "
              f"{KEEP_ENV}=1 keeps them)", flush=True)
