"""What `rlhf generate`, `eval` and `probe` check before any model loads, and their run with one-line errors.

The prompts or generations file is read and validated, and every data source in it must have a
scorer; a bad file, a missing scorer or a preflight refusal ends the command with one line.
"""

from __future__ import annotations

import sys

import datasets

from rlhf.data.arrow import data_sources as _sources_of
from rlhf.data.files import read_rows
from rlhf.data.schema import DataError
from rlhf.data.sources import load_rows
from rlhf.rewards import RewardManager, scorers_with
from rlhf.rewards.manager import UnknownDataSourceError
from rlhf.runtime.experiment import run_experiment
from rlhf.runtime.preflight import PreflightError

__all__ = ["check_sources", "data_sources", "generation_sources", "run_job"]


def check_sources(sources: set[str], scorer, scorers) -> None:
    """Exit with one line when some data source has no scorer: before any model loads, with the fix."""
    try:
        RewardManager(scorers_with(scorers, builtin=scorer is None), default=scorer).check_sources(sources)
    except UnknownDataSourceError as err:
        known = str(err).split("; Fix:")[0].split(". Fix:")[0]
        sys.exit(f"error: {known}. Fix: pass --scorer module:function (a scorer for every data source) or "
                 f"--scorer {sorted(sources)[0]}=module:function (see docs/generate_and_eval.md), or correct the "
                 "rows' data_source.")


def data_sources(path: str, kind: str, limit: int | None) -> set[str]:
    """The data sources of the prompts file (read and validated now: the run reads it from the cache)."""
    was_enabled = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()  # a check, not the run: its errors are one line
    try:
        return _sources_of(load_rows(path, kind=kind, limit=limit))
    except (DataError, FileNotFoundError) as err:
        sys.exit(f"error: {err}")
    finally:
        if was_enabled:
            datasets.enable_progress_bars()


def generation_sources(path: str) -> set[str]:
    """The data sources of a generations file."""
    try:
        return {row["data_source"] for row in read_rows(path)[0]}
    except (DataError, FileNotFoundError) as err:
        sys.exit(f"error: {err}")


def run_job(graph) -> dict:
    """run_experiment, with bad input (missing model or data, bad rows) as one error message."""
    try:
        return run_experiment(graph)
    except PreflightError as err:
        sys.exit(f"error: {err}")
