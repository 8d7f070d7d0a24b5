"""Read and write prompt rows as parquet, jsonl or json, checking every row on the way in.

Rows come back as plain Python (lists, dicts, ints: never numpy), with `extra_info`
always a dict. Parquet stores nested dicts as structs: a key that some rows lack comes
back as None in those rows (jsonl keeps rows exactly); `fingerprint_rows` treats a None
entry as a missing one, so the same rows have the same fingerprint from either file.
These Python-list readers serve small files and error reports; datasets for training
read files through Arrow (`rlhf.data.sources.load_rows`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

import numpy as np

from rlhf.data.schema import DataError, to_python, validate_row

SUFFIXES = (".parquet", ".jsonl", ".json")
MAX_REASONS = 5
"""How many skip reasons a `ReadReport` keeps (the count covers all of them)."""


class MissingDataFile(DataError, FileNotFoundError):
    """The data file does not exist (both a `DataError` and a `FileNotFoundError`)."""


@dataclasses.dataclass
class ReadReport:
    """What `read_rows` did: rows seen, kept, skipped, and why the first few were skipped."""

    path: str
    rows_total: int = 0
    rows_kept: int = 0
    rows_skipped: int = 0
    reasons: list[str] = dataclasses.field(default_factory=list)

    def _skip(self, reason: str) -> None:
        self.rows_skipped += 1
        if len(self.reasons) < MAX_REASONS:
            self.reasons.append(reason)

    def __str__(self) -> str:
        text = f"{self.path}: kept {self.rows_kept} of {self.rows_total} rows"
        if self.rows_skipped:
            text += f", skipped {self.rows_skipped}; first reasons:\n  " + "\n  ".join(self.reasons)
        return text


def read_rows(
    path: str | Path, *, on_error: Literal["raise", "skip"] = "raise", require_ground_truth: bool = True
) -> tuple[list[dict], ReadReport]:
    """Load and validate the rows of a `.parquet`, `.jsonl` or `.json` (a list of rows) file.

    on_error: "raise" stops at the first bad row with a `DataError` naming file, row and
      field; "skip" drops bad rows (and undecodable jsonl lines) and counts them in the report.
    require_ground_truth: False accepts rows without `reward_model` (prompts to generate for).
    """
    if on_error not in ("raise", "skip"):
        raise ValueError(f'on_error must be "raise" or "skip", got {on_error!r}')
    path = Path(path)
    _check_readable(path)
    report = ReadReport(path=str(path))
    rows: list[dict] = []
    for index, line, row in _parse(path, report, on_error):
        report.rows_total += 1
        try:
            row = to_python(row)
            validate_row(row, source=str(path), index=index, line=line, require_ground_truth=require_ground_truth)
        except DataError as err:
            if on_error == "raise":
                raise
            report._skip(str(err))
            continue
        if row.get("extra_info") is None:
            row["extra_info"] = {}
        rows.append(row)
    report.rows_kept = len(rows)
    return rows, report


def _check_readable(path: Path) -> None:
    if path.suffix not in SUFFIXES:
        raise DataError(
            f"{path}: unsupported file type {path.suffix or '(no suffix)'!r}. "
            f"Fix: use one of {', '.join(SUFFIXES)}.",
            source=str(path),
        )
    if not path.exists():
        raise MissingDataFile(
            f"{path}: no such data file. Fix: check the path, or create the data with "
            "`rlhf data prepare <task> --out DIR`, or from Python with the generators in "
            "rlhf.data (e.g. write_rows(arithmetic_rows(1000), path)).",
            source=str(path),
        )
    if path.is_dir():
        raise DataError(f"{path}: is a directory. Fix: give the path of one data file.", source=str(path))


def _parse(path: Path, report: ReadReport, on_error: str) -> Iterator[tuple[int, int | None, Any]]:
    """Yield (row index, 1-based line or None, raw row); decoding problems follow on_error."""
    if path.suffix == ".parquet":
        yield from ((i, None, row) for i, row in enumerate(_read_parquet(path)))
    elif path.suffix == ".json":
        rows = _read_json(path)
        yield from ((i, None, row) for i, row in enumerate(rows))
    else:
        yield from _read_jsonl(path, report, on_error)


def _read_parquet(path: Path) -> list[Any]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.read_table(path).to_pylist()
    except (pa.ArrowException, OSError) as err:
        raise DataError(
            f"{path}: not a readable parquet file ({err}). Fix: rewrite it with "
            "rlhf.data.write_rows, or check that the download finished.",
            source=str(path),
        ) from err


def _line_of(data: bytes, offset: int) -> int:
    return data.count(b"\n", 0, offset) + 1


def _read_json(path: Path) -> list[Any]:
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise DataError(
            f"{path}, line {_line_of(data, err.start)}: bytes that are not UTF-8 at byte offset "
            f"{err.start} ({data[err.start:err.start + 4]!r}). Fix: re-encode the file as UTF-8.",
            source=str(path),
        ) from err
    try:
        rows = json.loads(text)
    except json.JSONDecodeError as err:
        raise DataError(
            f"{path}, line {err.lineno} column {err.colno}: invalid JSON ({err.msg}). "
            "Fix: correct the file; a .json file holds one list of rows.",
            source=str(path),
        ) from err
    if not isinstance(rows, list):
        raise DataError(
            f"{path}: a .json data file must hold a list of rows, found a {type(rows).__name__}. "
            "Fix: wrap the rows in [...], or write one row per line and name the file .jsonl.",
            source=str(path),
        )
    return rows


def _read_jsonl(path: Path, report: ReadReport, on_error: str) -> Iterator[tuple[int, int, Any]]:
    index = 0
    with path.open("rb") as f:
        for line_number, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                row = parse_jsonl_line(raw, path, index, line_number)
            except DataError as err:
                report.rows_total += 1
                if on_error == "raise":
                    raise
                report._skip(str(err))
            else:
                yield index, line_number, row
            index += 1


def parse_jsonl_line(raw: bytes, path: str | Path, index: int, line_number: int) -> Any:
    """One line of a .jsonl file as Python; a `DataError` naming file, row and line if it is not JSON."""
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as err:
        problem = (
            f"{path}, row {index} (line {line_number}): bytes that are not UTF-8 at column "
            f"{err.start + 1} ({raw[err.start:err.start + 4]!r}). Fix: re-encode the file as UTF-8."
        )
    except json.JSONDecodeError as err:
        problem = (
            f"{path}, row {index} (line {line_number}): invalid JSON at column {err.colno} "
            f"({err.msg}). Fix: each line of a .jsonl file must be one complete JSON object."
        )
    raise DataError(problem, source=str(path), index=index)


def write_rows(rows: Iterable[Mapping], path: str | Path, *, require_ground_truth: bool = True) -> Path:
    """Validate all rows, then write them to `.parquet`, `.jsonl` or `.json` atomically.

    Nothing is written if any row is bad, and a crash mid-write leaves no partial file.
    `require_ground_truth=False` accepts rows without `reward_model` (generations of such prompts).
    """
    path = Path(path)
    if path.suffix not in SUFFIXES:
        raise DataError(
            f"{path}: unsupported file type {path.suffix or '(no suffix)'!r}. Fix: use one of {', '.join(SUFFIXES)}.",
            source=str(path),
        )
    rows = [to_python(row) for row in rows]
    for index, row in enumerate(rows):
        validate_row(row, source=f"rows for {path}", index=index, require_ground_truth=require_ground_truth)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        if path.suffix == ".parquet":
            _write_parquet(rows, tmp, path)
        else:
            _write_json(rows, tmp, path)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def _write_json(rows: list[dict], tmp: Path, path: Path) -> None:
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            if path.suffix == ".jsonl":
                for row in rows:
                    f.write(json.dumps(row, ensure_ascii=False) + "\n")
            else:
                json.dump(rows, f, ensure_ascii=False, indent=1)
    except (TypeError, ValueError) as err:
        raise DataError(
            f"{path}: rows cannot be written as JSON ({err}). Fix: keep rows to JSON types "
            "(str, int, float, bool, None, lists, dicts with string keys).",
            source=str(path),
        ) from err


def _write_parquet(rows: list[dict], tmp: Path, path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    # Columns are the union of all rows' keys (from_pylist would keep only the first row's).
    # Parquet cannot store a struct with no fields: an empty extra_info is written as
    # null, and read_rows turns it back into {}.
    columns = list(dict.fromkeys(key for row in rows for key in row))
    try:
        table = pa.table(
            {
                key: [(row.get(key) or None) if key == "extra_info" else row.get(key) for row in rows]
                for key in columns
            }
        )
        pq.write_table(table, tmp)
    except (pa.ArrowException, TypeError) as err:
        raise DataError(
            f"{path}: rows cannot be stored as parquet ({err}). Fix: give each field the same "
            "type in every row (e.g. all ground truths strings), or write .jsonl, which keeps any JSON.",
            source=str(path),
        ) from err


def without_none(value: Any) -> Any:
    """`value` as plain Python (as `to_python`) with every dict entry whose value is None removed, at any depth.

    Arrow (parquet, `datasets`) stores dicts as structs and fills the keys a row lacks with
    None, so a row read back from Arrow has None where the same row from JSON Lines has no key.
    A None entry and a missing one mean the same here; this is the one form both become.
    """
    kind = type(value)
    if kind is str or kind is int or kind is float or kind is bool:  # the common leaves, without ABC checks
        return value
    if kind is dict or isinstance(value, Mapping):
        return {k: without_none(v) for k, v in value.items() if v is not None}
    if kind is list or kind is tuple:
        return [without_none(v) for v in value]
    if isinstance(value, (np.ndarray, np.generic)):
        return without_none(to_python(value))
    return value


def canonical_json(row: Mapping, index: int = 0, *, normalized: bool = False) -> str:
    """`row` as compact, key-sorted JSON without None-valued dict entries (`without_none`; skipped when
    `normalized` says the row is already in that form): the form fingerprints are computed over,
    whichever route the row came by."""
    try:
        return json.dumps(row if normalized else without_none(row), sort_keys=True, ensure_ascii=False,
                          separators=(",", ":"))
    except (TypeError, ValueError) as err:
        raise DataError(
            f"row {index} cannot be fingerprinted: {err}. Fix: keep rows to JSON types "
            "(str, int, float, bool, None, lists, dicts with string keys).",
            index=index,
        ) from err


def fingerprint_rows(rows: Iterable[Mapping]) -> str:
    """sha256 of the rows as canonical JSON (`canonical_json`, one line each): equal rows give equal
    hex digests in any process, whatever the Python hash seed, and whichever route they came by
    (a list, parquet, JSON Lines, `datasets`: see `rlhf.data.arrow.rows_fingerprint`)."""
    digest = hashlib.sha256()
    for index, row in enumerate(rows):
        digest.update(canonical_json(row, index).encode("utf-8"))
        digest.update(b"\n")
    return digest.hexdigest()
