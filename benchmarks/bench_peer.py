"""What the benchmarks against TRL share (`grpo_vs_trl.py`, `preference_vs_trl.py`): TRL on the path, the
peer's ratio per repetition with its spread, and a process's peak resident memory by phase.

TRL is not a dependency of rlhf. Where it is not installed, an extracted wheel serves (nothing is
installed into the project's environment):

    pip download trl==1.16.0 --no-deps -d /tmp/trl && unzip -q /tmp/trl/trl-1.16.0-*.whl -d /tmp/trl/x
    RLHF_TRL_PATH=/tmp/trl/x python benchmarks/preference_vs_trl.py --quick

(the same variable as the loss golden tests, tests/algos/trl_reference.py). Child processes inherit it.
"""

from __future__ import annotations

import importlib
import os
import statistics
import sys
from pathlib import Path

TRL_VERSION = "1.16.0"
"""The TRL release the peer benchmarks were written against (its trainers' arguments and defaults)."""


def use_trl() -> str | None:
    """Put $RLHF_TRL_PATH (if set) on sys.path; TRL's version where it imports, else None."""
    path = os.environ.get("RLHF_TRL_PATH")
    if path and path not in sys.path:
        sys.path.insert(0, path)
    try:
        return importlib.import_module("trl").__version__
    except ImportError:
        return None


def trl_missing_reason() -> str | None:
    """None where TRL {TRL_VERSION} imports; else why not and how to get it (for a skip or an error)."""
    version = use_trl()
    if version is None:
        return (f"TRL {TRL_VERSION} is not importable: pip install trl=={TRL_VERSION}, or set RLHF_TRL_PATH to an "
                f"extracted trl-{TRL_VERSION} wheel (benchmarks/bench_peer.py says how)")
    if version != TRL_VERSION:
        return f"these benchmarks set TRL {TRL_VERSION}'s arguments; found TRL {version}"
    return None


def ratio_spread(ratios: list[float], prefix: str = "speedup") -> dict:
    """`{prefix}_per_rep`, `{prefix}_median`, `{prefix}_range` of per-repetition ratios (TRL's figure over ours,
    each from two runs next to each other, under the same load); {} when there are none."""
    if not ratios:
        return {}
    return {f"{prefix}_per_rep": [round(x, 3) for x in ratios], f"{prefix}_median": statistics.median(ratios),
            f"{prefix}_range": [min(ratios), max(ratios)]}


class PeakRSS:
    """The kernel's high-water mark of this process's resident memory (VmHWM), reset between phases.

    Polling RSS misses short peaks; VmHWM does not. Writing 5 to /proc/self/clear_refs resets it (Linux),
    so `mark(name)` records the peak since the last mark and starts a new phase. Where the file cannot be
    written the marks are cumulative (each the peak since the start), which `resettable` says.
    """

    def __init__(self):
        self.peaks_mib: dict[str, float] = {}
        self.resettable = True

    @staticmethod
    def current_hwm_mib() -> float:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def mark(self, name: str) -> None:
        self.peaks_mib[name] = round(self.current_hwm_mib(), 1)
        try:
            Path("/proc/self/clear_refs").write_text("5")
        except OSError:
            self.resettable = False
