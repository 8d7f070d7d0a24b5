"""Rows as Arrow: a file, a hub dataset, a local folder or a list of dicts -> one validated `datasets.Dataset`.

A validated dataset (`is_validated`) has two columns: `row`, each row as canonical JSON
(`rlhf.data.files.canonical_json`: None entries dropped, `extra_info` a dict), and
`data_source`. Whatever route the rows came by, the same rows give the same `row` strings,
so the same fingerprint (`rows_fingerprint`, equal to `fingerprint_rows` of the Python rows),
and every later step (tokenising, the overlong policy) is cached on disk under that
fingerprint, not under a file name or a modification time.

Work over many rows runs as batched `Dataset.map` calls with an explicit cache file
(`cached_map`) under `cache_root()`: HF_DATASETS_CACHE/rlhf, or `<cache_dir>/rlhf`. A second
start, a resume, or the build after preflight loads the Arrow files (memory-mapped) instead of
redoing the work. Bad rows are marked in the map and their messages are rebuilt afterwards by
the same Python checks `read_rows` uses, so errors name the file, row (and line), and field.
"""

from __future__ import annotations

import functools
import gc
import hashlib
import json
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import datasets
import numpy as np

from rlhf.choices import check_choice
from rlhf.data.files import (
    MAX_REASONS,
    ReadReport,
    _check_readable,
    canonical_json,
    parse_jsonl_line,
    read_rows,
    without_none,
)
from rlhf.data.schema import DataError, is_preference_row, preference_file_hint, to_python, validate_row

VERSION = "1"
"""Part of every cache key: bump it when a cached map's output changes for the same input."""

PARALLEL_FROM_ROWS = 50_000
"""`num_proc=None` maps with one process per available core from this many rows (below, forking costs more)."""

RowKind = Literal["prompt", "generation", "sft"]
OnError = Literal["raise", "skip"]  # a bad row stops the read, or is dropped and counted
"""prompt: every row must follow verl's prompt schema; generation: the same, but `reward_model` (the
ground truth) may be left out (prompts to generate for); sft: chat rows with `messages` pass unchecked
(SFTDataset checks them) and the others must follow the prompt schema."""

OK, BLANK, BAD = 0, 1, 2  # `status` of a row in the validation map: kept, a blank jsonl line, invalid

ROW_FEATURES = datasets.Features(
    {"row": datasets.Value("string"), "data_source": datasets.Value("string"), "status": datasets.Value("int8")}
)


# ------------------------------------------------------------------ caching
def cache_root(cache_dir: str | Path | None = None) -> Path:
    """Where the cached maps live: `<cache_dir>/rlhf`, or `$HF_DATASETS_CACHE/rlhf` by default."""
    base = Path(cache_dir).expanduser() if cache_dir is not None else Path(datasets.config.HF_DATASETS_CACHE)
    return base / "rlhf"


def cache_key(*parts: Any) -> str:
    """A 32-hex-digit key over JSON-able parts (and `VERSION`): equal parts, equal key, in any process."""
    text = json.dumps([VERSION, *parts], sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


def tokenizer_key(tokenizer: Any) -> str:
    """What decides a tokenizer's output here: its vocabulary and rules, chat template and special tokens."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    rules = backend.to_str() if backend is not None else datasets.fingerprint.Hasher.hash(tokenizer)
    return cache_key(
        type(tokenizer).__name__, hashlib.sha256(rules.encode("utf-8")).hexdigest(),
        getattr(tokenizer, "chat_template", None), getattr(tokenizer, "eos_token_id", None),
        sorted(getattr(tokenizer, "all_special_tokens", [])),
    )


def auto_num_proc(num_rows: int, num_proc: int | None) -> int | None:
    """`num_proc` if given, else one process per available core for large datasets (None: in-process)."""
    if num_proc is not None:
        return num_proc if num_proc > 1 else None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return cores if cores > 1 and num_rows >= PARALLEL_FROM_ROWS else None


def gc_paused(function: Callable, *args: Any, **kwargs: Any) -> Any:
    """`function(*args, **kwargs)` with Python's cyclic garbage collector paused.

    A map batch allocates thousands of short-lived, acyclic lists and dicts (freed by reference
    counting), and each allocation burst triggers collections that walk every object alive in the
    process (torch's and transformers' millions): a sixth of tokenising time before it was paused."""
    if not gc.isenabled():
        return function(*args, **kwargs)
    gc.disable()
    try:
        return function(*args, **kwargs)
    finally:
        gc.enable()


def cached_map(
    dataset: datasets.Dataset,
    function: Callable,
    *,
    name: str,
    key: str,
    cache_dir: str | Path | None,
    num_proc: int | None,
    features: datasets.Features,
    fn_kwargs: Mapping[str, Any] | None = None,
    with_indices: bool = False,
    batch_size: int = 1000,
) -> datasets.Dataset:
    """`dataset.map(function, batched=True)` replacing every column, stored as `<cache_root>/<name>-<key>.arrow`
    (one file per process with `num_proc`) and loaded from there when it exists; each batch runs with the
    garbage collector paused (`gc_paused`)."""
    root = cache_root(cache_dir)
    root.mkdir(parents=True, exist_ok=True)
    return dataset.map(
        functools.partial(gc_paused, function),
        batched=True,
        batch_size=batch_size,
        with_indices=with_indices,
        fn_kwargs=dict(fn_kwargs or {}),
        remove_columns=dataset.column_names,
        features=features,
        cache_file_name=str(root / f"{name}-{key}.arrow"),
        load_from_cache_file=True,
        new_fingerprint=key,
        num_proc=auto_num_proc(len(dataset), num_proc),
        desc=f"rlhf {name}",
    )


# --------------------------------------------------------------- validation
def normalize_row(row: Any, *, source: str, index: int, kind: RowKind = "prompt", line: int | None = None) -> dict:
    """`row` checked (`validate_row`, as `read_rows` does) and in canonical form (`without_none`,
    `extra_info` a dict); chat rows with `messages` (kind "sft") are only made plain Python."""
    row = to_python(row)
    if kind == "sft" and is_preference_row(row):  # a verl-complete pair would silently train on its ground truth
        where = f"{source}, row {index}" + (f" (line {line})" if line is not None else "")
        raise DataError(f"{where}: {preference_file_hint('SFT trains on one response per prompt, not on pairs')}.",
                        source=source, index=index, field="chosen")
    if kind == "sft" and isinstance(row, Mapping) and "messages" in row:
        return without_none(row)
    validate_row(row, source=source, index=index, line=line, require_ground_truth=kind != "generation")
    row = without_none(row)
    row.setdefault("extra_info", {})
    return row


def _validate_batch(
    batch: dict[str, list], indices: list[int], *, source: str, kind: RowKind, jsonl: bool
) -> dict[str, list]:
    """The validation map: each input row -> (`row` canonical JSON, `data_source`, `status`)."""
    if jsonl:
        raws: Iterable[Any] = batch["text"]
    else:
        columns = list(batch)
        raws = (dict(zip(columns, values)) for values in zip(*(batch[c] for c in columns)))
    out: dict[str, list] = {"row": [], "data_source": [], "status": []}
    for index, raw in zip(indices, raws):
        text, data_source, status = "", None, OK
        if jsonl and not raw.strip():
            status = BLANK
        else:
            try:
                row = normalize_row(json.loads(raw) if jsonl else raw, source=source, index=index, kind=kind)
                text = canonical_json(row, index, normalized=True)
                data_source = row.get("data_source")
            except (DataError, ValueError, TypeError):  # the message is rebuilt exactly in `_bad_row_errors`
                status = BAD
        out["row"].append(text)
        out["data_source"].append(data_source if isinstance(data_source, str) else None)
        out["status"].append(status)
    return out


def _bad_row_errors(
    raw: datasets.Dataset, status: np.ndarray, bad: np.ndarray, *, source: str, kind: RowKind, jsonl: bool
) -> list[DataError]:
    """The DataErrors of the rows at positions `bad`, as `read_rows` words them (file, row, line, field)."""
    errors = []
    blanks_before = np.cumsum(status == BLANK) if jsonl else None
    for position in bad.tolist():
        try:
            if jsonl:
                index = position - int(blanks_before[position])
                line = position + 1
                row = parse_jsonl_line(raw[position]["text"].encode("utf-8"), source, index, line)
                normalize_row(row, source=source, index=index, kind=kind, line=line)
                canonical_json(row, index)
            else:
                row = normalize_row(raw[position], source=source, index=position, kind=kind)
                canonical_json(row, position)
        except DataError as err:
            if err.source is None:  # canonical_json does not know the file
                err = DataError(f"{source}, {err}", source=source, index=err.index)
            errors.append(err)
        except (ValueError, TypeError) as err:
            errors.append(DataError(f"{source}, row {position}: {err}", source=source, index=position))
    return errors


def validate_dataset(
    raw: datasets.Dataset,
    *,
    source: str,
    kind: RowKind = "prompt",
    on_error: OnError = "raise",
    jsonl: bool = False,
    cache_dir: str | Path | None = None,
    num_proc: int | None = None,
) -> tuple[datasets.Dataset, ReadReport]:
    """A validated dataset (`row`, `data_source`) from a raw one (verl columns, or a `text` column of
    JSON lines with `jsonl`): bad rows stop it (`on_error="raise"`) or are dropped and reported."""
    check_choice("validate_dataset: on_error", on_error, OnError)
    check_choice("validate_dataset: kind", kind, RowKind)
    key = cache_key("rows", raw._fingerprint, kind, jsonl)
    mapped = cached_map(
        raw, _validate_batch, name="rows", key=key, cache_dir=cache_dir, num_proc=num_proc,
        features=ROW_FEATURES, fn_kwargs={"source": source, "kind": kind, "jsonl": jsonl}, with_indices=True,
    )
    status = mapped.data.column("status").to_numpy()
    bad = np.flatnonzero(status == BAD)
    report = ReadReport(path=source, rows_total=int((status != BLANK).sum()))
    if len(bad):
        errors = _bad_row_errors(raw, status, bad[: 1 if on_error == "raise" else MAX_REASONS],
                                 source=source, kind=kind, jsonl=jsonl)
        if on_error == "raise":
            raise errors[0]
        report.rows_skipped = len(bad)
        report.reasons = [str(e) for e in errors]
    if len(bad) or (status == BLANK).any():
        mapped = mapped.select(np.flatnonzero(status == OK))
    report.rows_kept = len(mapped)
    return mapped.remove_columns("status"), report


def is_validated(dataset: Any) -> bool:
    """Whether `dataset` is a validated rows dataset (exactly the columns `row` and `data_source`)."""
    return isinstance(dataset, datasets.Dataset) and sorted(dataset.column_names) == ["data_source", "row"]


def rows_from_list(rows: Sequence[Mapping], *, source: str, kind: RowKind = "prompt") -> datasets.Dataset:
    """A validated in-memory dataset from Python rows (a generator's output), checked row by row.

    The rows are stored as canonical JSON strings rather than typed columns
    (`Dataset.from_list` would infer one Arrow type per column from the first rows and refuse or
    reshape rows that differ, e.g. different `extra_info` keys).
    """
    texts, sources = [], []
    for index, row in enumerate(rows):
        row = normalize_row(row, source=source, index=index, kind=kind)
        texts.append(canonical_json(row, index, normalized=True))
        sources.append(row.get("data_source") if isinstance(row.get("data_source"), str) else None)
    features = datasets.Features({"row": datasets.Value("string"), "data_source": datasets.Value("string")})
    return datasets.Dataset.from_dict({"row": texts, "data_source": sources}, features=features)


def as_rows(
    rows: Any,
    *,
    source: str,
    kind: RowKind = "prompt",
    cache_dir: str | Path | None = None,
    num_proc: int | None = None,
) -> datasets.Dataset:
    """Any accepted `rows` argument as a validated dataset: a validated dataset as it is, another
    `datasets.Dataset` (verl columns) through the validation map, a sequence of dicts via `rows_from_list`."""
    if is_validated(rows):
        return rows
    if isinstance(rows, datasets.Dataset):
        return validate_dataset(rows, source=source, kind=kind, cache_dir=cache_dir, num_proc=num_proc)[0]
    if isinstance(rows, datasets.IterableDataset):
        raise TypeError(f"{source}: a streaming IterableDataset needs StreamingPromptDataset, not this dataset class")
    return rows_from_list(list(rows), source=source, kind=kind)


def to_rows(rows: datasets.Dataset) -> list[dict]:
    """The rows of a validated dataset as Python dicts (canonical form), for small datasets and tests."""
    return [json.loads(text) for text in rows["row"]]


def rows_fingerprint(rows: datasets.Dataset, *, cache_dir: str | Path | None = None) -> str:
    """`fingerprint_rows` of a validated dataset's rows, read from the Arrow column in chunks.

    For a dataset backed by cache files the result is kept beside them (keyed by the dataset's
    own fingerprint), so a warm start does not read every row again.
    """
    memo = None
    if rows.cache_files:
        memo = cache_root(cache_dir) / "fingerprints" / f"{rows._fingerprint}.sha256"
        if memo.exists():
            return memo.read_text().strip()
    digest = hashlib.sha256()
    table = rows.with_format("arrow")
    for start in range(0, len(rows), 65_536):
        chunk = table[start : start + 65_536]["row"].to_pylist()
        digest.update(("\n".join(chunk) + "\n").encode("utf-8"))
    fingerprint = digest.hexdigest()
    if memo is not None:
        memo.parent.mkdir(parents=True, exist_ok=True)
        tmp = memo.with_name(f".{memo.name}.{os.getpid()}")
        tmp.write_text(fingerprint)
        os.replace(tmp, memo)
    return fingerprint


def data_sources(rows: datasets.Dataset) -> set[str]:
    """The distinct `data_source` values of a validated dataset (chat rows have none)."""
    import pyarrow.compute as pc

    return {s for s in pc.unique(rows.data.column("data_source")).to_pylist() if s is not None}


def source_name(rows: Any, default: str) -> str:
    """The file or hub id a dataset was read from (set by the loaders in `info.description`), else `default`."""
    info = getattr(rows, "info", None)
    description = getattr(info, "description", None) or ""
    return description.removeprefix("rlhf rows of ") if description.startswith("rlhf rows of ") else default


def mark_source(rows: datasets.Dataset, source: str) -> datasets.Dataset:
    """Record where `rows` came from, for error messages (`source_name`)."""
    rows.info.description = f"rlhf rows of {source}"
    return rows


# -------------------------------------------------------------------- files
def builder_for(path: Path) -> str:
    """The `datasets` builder that reads a data file: parquet as typed Arrow, JSON Lines as text lines."""
    return "parquet" if path.suffix == ".parquet" else "text"


def load_file(
    path: str | Path,
    *,
    kind: RowKind = "prompt",
    on_error: OnError = "raise",
    cache_dir: str | Path | None = None,
    num_proc: int | None = None,
) -> tuple[datasets.Dataset, ReadReport]:
    """A validated dataset of a `.parquet`, `.jsonl` or `.json` file, and what was kept or skipped.

    Parquet and JSON Lines go through `datasets` (Arrow, cached); a `.json` file (one list) is
    read whole in Python. A file `datasets` cannot read (bad bytes, broken parquet) is read
    again by `read_rows` for its exact error message. A file with no rows is an error.
    """
    file = Path(path).expanduser()
    _check_readable(file)
    source = str(path)
    if file.stat().st_size == 0:
        raise DataError(f"{source}: the file is empty (0 bytes). Fix: write the rows again, or point at another file.",
                        source=source)
    if file.suffix == ".json":
        python_rows, report = read_rows(file, on_error=on_error, require_ground_truth=kind != "generation")
        dataset = rows_from_list(python_rows, source=source, kind=kind)
    else:
        try:
            raw = datasets.load_dataset(
                builder_for(file), data_files=str(file.resolve()), split="train",
                cache_dir=str(Path(cache_dir).expanduser() / "datasets") if cache_dir is not None else None,
            )
        except Exception as err:  # noqa: BLE001 - datasets raises many types; read_rows words the cause
            # raises the exact DataError when the data is at fault
            if not read_rows(file, on_error="raise", require_ground_truth=kind != "generation")[0]:
                raise DataError(f"{source}: the file has no rows. Fix: write the rows again, or point at another "
                                "file.", source=source) from err
            raise DataError(f"{source}: cannot be read with `datasets` ({type(err).__name__}: {err}). "
                            "Fix: check the file, or rewrite it with rlhf.data.write_rows.", source=source) from err
        dataset, report = validate_dataset(raw, source=source, kind=kind, on_error=on_error,
                                           jsonl=file.suffix == ".jsonl", cache_dir=cache_dir, num_proc=num_proc)
    if len(dataset) == 0:
        if report.rows_total == 0:
            raise DataError(f"{source}: the file has no rows. Fix: write the rows again, or point at another file.",
                            source=source)
        raise DataError(f"{source}: every row was skipped as invalid ({report}). Fix: correct the rows.",
                        source=source)
    return mark_source(dataset, source), report
