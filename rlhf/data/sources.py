"""Row sources for graphs: a data file, checked before any stage starts."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any, Literal

from rlhf.data.files import read_rows


def load_rows(path: str, on_error: Literal["raise", "skip"] = "raise") -> list[dict]:
    """Rows of a parquet / JSON Lines / JSON file in verl's schema (bad rows stop or are skipped)."""
    rows, report = read_rows(path, on_error=on_error)
    if report.rows_skipped:
        warnings.warn(str(report))
    return rows


def _preflight(arguments: Mapping[str, Any]) -> None:
    """Read and validate the file now, so a missing file or a bad row stops the run before training."""
    if isinstance(arguments.get("path"), str):
        read_rows(arguments["path"], on_error=arguments.get("on_error", "raise"))


load_rows.preflight = _preflight  # type: ignore[attr-defined]
