"""Rows from Hugging Face `datasets`: a local folder or file, or a hub dataset when reachable.

The rows come back as a validated Arrow dataset (`rlhf.data.arrow`), exactly as
`rlhf.data.sources.load_rows` returns a file's, so the same data read from a parquet file
or through `datasets.load_dataset` has the same fingerprint.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Literal

import datasets

from rlhf.data.arrow import mark_source, validate_dataset
from rlhf.data.schema import DataError


def _is_local(path: str) -> bool:
    return os.path.exists(os.path.expanduser(path))


def load_hf_rows(
    path: str,  # a hub dataset id ("openai/gsm8k"), a local dataset folder, or a builder name ("parquet")
    split: str = "train",  # the split to read, e.g. "train", "test", "train[:100]"
    name: str | None = None,  # the dataset configuration ("main" for GSM8K)
    data_files: str | list[str] | dict[str, Any] | None = None,  # files for a builder such as "parquet"
    on_error: Literal["raise", "skip"] = "raise",  # a bad row stops the run, or is dropped
    cache_dir: str | None = None,  # None: $HF_DATASETS_CACHE (see rlhf.data.arrow.cache_root)
    num_proc: int | None = None,  # processes for validating; None: one per core from 50k rows
) -> datasets.Dataset:
    """The rows of one split via `datasets.load_dataset`, validated row by row into Arrow (cached).

    The rows must already be in verl's prompt-row schema (as verl's preprocessing scripts or
    `rlhf data prepare` write them); raw hub datasets (question/answer columns) need that step first.
    """
    where = f"{path}" + (f" ({name})" if name else "") + f" split {split!r}"
    local = _is_local(path) or data_files is not None
    try:
        raw = datasets.load_dataset(
            os.path.expanduser(path) if _is_local(path) else path, name, split=split, data_files=data_files,
            cache_dir=os.path.join(os.path.expanduser(cache_dir), "datasets") if cache_dir is not None else None,
        )
    except (ConnectionError, OSError) as err:
        if local:
            raise DataError(
                f"{where}: cannot be read ({err}). Fix: check the path and the data files.", source=where
            ) from err
        raise DataError(
            f"{where}: the Hugging Face hub could not be reached or has no such dataset ({type(err).__name__}: {err}). "
            "Fix (offline): download the data on a connected machine and pass its folder or files "
            "(load_hf_rows('parquet', data_files='DIR/train.parquet')), read a file with "
            "rlhf.data.sources.load_rows, or generate data with `rlhf data prepare <task> --out DIR`.",
            source=where,
        ) from err
    except ValueError as err:  # e.g. an unknown split or configuration name
        raise DataError(f"{where}: {err}", source=where) from err
    rows, _ = validate_dataset(raw, source=where, on_error=on_error, cache_dir=cache_dir, num_proc=num_proc)
    if len(rows) == 0:
        raise DataError(f"{where}: no rows. Fix: check the split and the data files.", source=where)
    return mark_source(rows, where)


def _preflight(arguments: Mapping[str, Any]) -> None:
    """Load and validate the rows now (cached for the run), so a missing file or hub stops the run before training."""
    if isinstance(arguments.get("path"), str):
        load_hf_rows(**{k: v for k, v in arguments.items() if k != "num_proc"}, num_proc=arguments.get("num_proc"))


def _input_files(arguments: Mapping[str, Any]) -> list[str]:
    """The local files or folder whose contents a named run records (rlhf.runtime.run_record); a hub
    dataset is named by its id and revision in the graph."""
    files = arguments.get("data_files")
    if isinstance(files, str):
        return [files]
    if isinstance(files, (list, tuple)):
        return [f for f in files if isinstance(f, str)]
    if isinstance(files, Mapping):
        return [f for v in files.values() for f in ([v] if isinstance(v, str) else v) if isinstance(f, str)]
    path = arguments.get("path")
    return [path] if isinstance(path, str) and _is_local(path) else []


load_hf_rows.preflight = _preflight  # type: ignore[attr-defined]
load_hf_rows.input_files = _input_files  # type: ignore[attr-defined]
