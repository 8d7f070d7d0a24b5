"""Row sources for graphs: a data file read into Arrow (`datasets`), checked before any stage starts."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any, Literal

import datasets

from rlhf.data.arrow import RowKind, load_file, mark_source, source_name
from rlhf.data.streaming import stream_file
from rlhf.ranges import PositiveInt
from rlhf.signatures import with_defaults


def load_rows(
    path: str,
    on_error: Literal["raise", "skip"] = "raise",  # a bad row stops the run, or is dropped and counted in a warning
    streaming: bool = False,  # True: an IterableDataset read lazily (for StreamingPromptDataset), nothing cached
    cache_dir: str | None = None,  # None: $HF_DATASETS_CACHE (see rlhf.data.arrow.cache_root)
    num_proc: int | None = None,  # processes for validating; None: one per core from 50k rows
    kind: RowKind = "prompt",  # "generation": rows may leave out reward_model (nothing scores them)
    limit: PositiveInt | None = None,  # keep the first `limit` rows only; None: all
) -> datasets.Dataset | datasets.IterableDataset:
    """Rows of a parquet / JSON Lines / JSON file in verl's schema, as a validated Arrow dataset
    (`rlhf.data.arrow`): memory-mapped, cached, and checked row by row (errors name file, row, field)."""
    if streaming:
        rows = stream_file(path, on_error=on_error, kind=kind)
        return rows.take(limit) if limit is not None else rows
    rows, report = load_file(path, kind=kind, on_error=on_error, cache_dir=cache_dir, num_proc=num_proc)
    if report.rows_skipped:
        warnings.warn(str(report))
    if limit is not None and limit < len(rows):
        rows = mark_source(rows.select(range(limit)), source_name(rows, str(path)))
    return rows


def _preflight(arguments: Mapping[str, Any]) -> None:
    """Read and validate the file now (the result is cached for the run), so a missing or empty file
    or a bad row stops the run before training."""
    a = with_defaults(load_rows, arguments)
    if isinstance(a.get("path"), str):  # required: absent until set
        if a["streaming"]:
            stream_file(a["path"], on_error=a["on_error"], kind=a["kind"], check=True)
            return
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the run's own build warns about skipped rows
            load_file(a["path"], kind=a["kind"], on_error=a["on_error"], cache_dir=a["cache_dir"],
                      num_proc=a["num_proc"])


def _input_files(arguments: Mapping[str, Any]) -> list[str]:
    """The file whose contents a named run records (rlhf.runtime.run_record): rewriting it is a change."""
    return [arguments["path"]] if isinstance(arguments.get("path"), str) else []


load_rows.preflight = _preflight  # type: ignore[attr-defined]
load_rows.input_files = _input_files  # type: ignore[attr-defined]

__all__ = ["load_rows"]
