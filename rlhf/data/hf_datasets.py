"""Rows from Hugging Face `datasets`: a local folder or file, or a hub dataset when reachable.

`datasets` is optional (`pip install datasets`); without it, or offline with a hub id, the
error says how to get the rows another way. Rows come back as plain Python and are checked
with `validate_row`, exactly as `rlhf.data.sources.load_rows` returns them, so the same data
read from a parquet file or through `datasets` has the same fingerprint.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from rlhf.data.schema import DataError, to_python, validate_row

INSTALL_HINT = (
    "Fix: install it (`pip install datasets`), or read the files directly with "
    "rlhf.data.sources.load_rows (parquet / jsonl / json)."
)


def _datasets_module():
    try:
        import datasets
    except ImportError as err:
        raise ImportError(
            f"load_hf_rows needs the Hugging Face `datasets` package, which is not installed. {INSTALL_HINT}"
        ) from err
    return datasets


def _is_local(path: str) -> bool:
    return os.path.exists(os.path.expanduser(path))


def load_hf_rows(
    path: str,  # a hub dataset id ("openai/gsm8k"), a local dataset folder, or a builder name ("parquet")
    split: str = "train",  # the split to read, e.g. "train", "test", "train[:100]"
    name: str | None = None,  # the dataset configuration ("main" for GSM8K)
    data_files: str | list[str] | dict[str, Any] | None = None,  # files for a builder such as "parquet"
) -> list[dict]:
    """The rows of one split via `datasets.load_dataset`, as plain Python, each checked by `validate_row`.

    The rows must already be in verl's prompt-row schema (as verl's preprocessing scripts or
    `rlhf data prepare` write them); raw hub datasets (question/answer columns) need that step first.
    """
    datasets = _datasets_module()
    where = f"{path}" + (f" ({name})" if name else "") + f" split {split!r}"
    local = _is_local(path) or data_files is not None
    try:
        dataset = datasets.load_dataset(
            os.path.expanduser(path) if _is_local(path) else path, name, split=split, data_files=data_files
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
    rows = []
    for index, row in enumerate(dataset):
        row = to_python(dict(row))
        validate_row(row, source=where, index=index)
        if row.get("extra_info") is None:
            row["extra_info"] = {}
        rows.append(row)
    return rows


def _preflight(arguments: Mapping[str, Any]) -> None:
    """Load and validate the rows now, so a missing package, file or hub stops the run before training."""
    if isinstance(arguments.get("path"), str):
        load_hf_rows(
            arguments["path"],
            split=arguments.get("split", "train"),
            name=arguments.get("name"),
            data_files=arguments.get("data_files"),
        )


load_hf_rows.preflight = _preflight  # type: ignore[attr-defined]
