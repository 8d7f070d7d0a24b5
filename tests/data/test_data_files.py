"""read_rows / write_rows / fingerprint_rows: round trips, bad rows, bad bytes, stable hashes."""

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from rlhf.data import (
    DataError,
    MissingDataFile,
    arithmetic_rows,
    countdown_rows,
    fingerprint_rows,
    gsm8k_like_rows,
    read_rows,
    write_rows,
)


def sample_rows() -> list[dict]:
    return arithmetic_rows(5, seed=1) + gsm8k_like_rows(5, seed=1) + countdown_rows(5, seed=1)


def _plain_python(value) -> bool:
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain_python(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_plain_python(v) for v in value)
    return value is None or type(value) in (str, int, float, bool)


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl", ".json"])
def test_round_trip_keeps_rows_and_fingerprint(tmp_path, suffix):
    # One generator per file: parquet unifies struct fields across rows (see files.py).
    for rows in (arithmetic_rows(20, seed=1), gsm8k_like_rows(20, seed=1), countdown_rows(20, seed=1)):
        path = write_rows(rows, tmp_path / f"data{suffix}")
        back, report = read_rows(path)
        assert back == rows
        assert _plain_python(back)
        assert fingerprint_rows(back) == fingerprint_rows(rows)
        assert (report.rows_total, report.rows_kept, report.rows_skipped) == (20, 20, 0)


def test_parquet_keeps_columns_missing_from_the_first_row(tmp_path):
    rows = arithmetic_rows(2)
    del rows[0]["ability"]
    back, _ = read_rows(write_rows(rows, tmp_path / "x.parquet"))
    assert back[1]["ability"] == "arithmetic" and back[0]["ability"] is None


def test_empty_extra_info_round_trips_through_parquet(tmp_path):
    rows = arithmetic_rows(3)
    for row in rows:
        row["extra_info"] = {}
    back, _ = read_rows(write_rows(rows, tmp_path / "x.parquet"))
    assert back == rows


def test_read_fills_missing_extra_info_with_empty_dict(tmp_path):
    rows = arithmetic_rows(2)
    del rows[0]["extra_info"]
    path = tmp_path / "x.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    back, _ = read_rows(path)
    assert back[0]["extra_info"] == {} and back[1]["extra_info"]["index"] == 1


def test_pandas_written_parquet_is_read_as_plain_python(tmp_path):
    # verl's preprocessing writes parquet from pandas/datasets; numbers in a dict ground truth
    # (TinyZero countdown) and the prompt list must come back as lists, not numpy arrays.
    rows = countdown_rows(3)
    for row in rows:
        row["reward_model"]["ground_truth"] = json.loads(row["reward_model"]["ground_truth"])
    path = tmp_path / "verl.parquet"
    pd.DataFrame(rows).to_parquet(path)
    assert isinstance(pd.read_parquet(path)["prompt"][0], np.ndarray)  # what pandas gives
    back, _ = read_rows(path)
    assert back == rows and _plain_python(back)


def test_fingerprint_is_canonical():
    # Pinned encoding: one compact, key-sorted JSON object per row, each followed by "\n".
    rows = [{"b": 1, "a": "é"}, {"a": [1, 2.5, None]}]
    expected = hashlib.sha256('{"a":"é","b":1}\n{"a":[1,2.5,null]}\n'.encode()).hexdigest()
    assert fingerprint_rows(rows) == expected
    assert fingerprint_rows([{"a": "é", "b": 1}, {"a": (1, 2.5, None)}]) == expected  # key order, tuples
    assert fingerprint_rows(rows[::-1]) != expected  # row order matters
    assert fingerprint_rows([{"a": np.int64(1)}]) == fingerprint_rows([{"a": 1}])


def test_fingerprint_rejects_non_json_values():
    with pytest.raises(DataError, match="row 1 cannot be fingerprinted"):
        fingerprint_rows([{"a": 1}, {"a": object()}])


def test_fingerprint_is_stable_across_processes_and_hash_seeds(tmp_path):
    path = write_rows(sample_rows(), tmp_path / "rows.jsonl")
    code = (
        "import sys; from rlhf.data import *; "
        "rows = arithmetic_rows(5, seed=1) + gsm8k_like_rows(5, seed=1) + countdown_rows(5, seed=1); "
        "print(fingerprint_rows(rows)); print(fingerprint_rows(read_rows(sys.argv[1])[0]))"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", code, str(path)], env=env, capture_output=True, text=True, check=True,
        cwd=Path(__file__).parents[2],
    ).stdout.split()
    expected = fingerprint_rows(sample_rows())
    assert out == [expected, expected]


def _bad_jsonl(tmp_path) -> Path:
    rows = arithmetic_rows(4)
    del rows[1]["prompt"]
    rows[3]["reward_model"]["ground_truth"] = 7
    path = tmp_path / "train.jsonl"
    lines = [json.dumps(r) for r in rows]
    lines.insert(2, "")  # a blank line: skipped, but line numbers still count it
    path.write_text("\n".join(lines) + "\n")
    return path


def test_bad_row_raises_with_file_row_line_and_field(tmp_path):
    path = _bad_jsonl(tmp_path)
    with pytest.raises(DataError) as info:
        read_rows(path)
    assert str(info.value).startswith(f"{path}, row 1 (line 2): field 'prompt' is missing")


def test_bad_rows_skipped_and_reported(tmp_path):
    path = _bad_jsonl(tmp_path)
    rows, report = read_rows(path, on_error="skip")
    assert [r["extra_info"]["index"] for r in rows] == [0, 2]
    assert (report.rows_total, report.rows_kept, report.rows_skipped) == (4, 2, 2)
    assert "row 1 (line 2): field 'prompt'" in report.reasons[0]
    assert "row 3 (line 5): field 'reward_model.ground_truth'" in report.reasons[1]
    assert "skipped 2" in str(report)


def test_report_keeps_only_the_first_reasons(tmp_path):
    rows = arithmetic_rows(12)
    for row in rows:
        del row["data_source"]
    path = write_rows(arithmetic_rows(1), tmp_path / "x.jsonl")
    path.write_text("\n".join(json.dumps(r) for r in rows))
    kept, report = read_rows(path, on_error="skip")
    assert kept == [] and report.rows_skipped == 12 and len(report.reasons) == 5


def test_non_utf8_jsonl_names_file_and_line(tmp_path):
    path = tmp_path / "latin1.jsonl"
    good = json.dumps(arithmetic_rows(1)[0]).encode()
    bad = json.dumps(arithmetic_rows(2)[1]).replace("What", "Wh\u00e4t").encode("latin-1")
    path.write_bytes(good + b"\n" + bad + b"\n" + good + b"\n")
    with pytest.raises(DataError, match=r"latin1\.jsonl, row 1 \(line 2\): bytes that are not UTF-8.*re-encode"):
        read_rows(path)
    rows, report = read_rows(path, on_error="skip")
    assert len(rows) == 2 and report.rows_skipped == 1 and "not UTF-8" in report.reasons[0]


def test_invalid_json_line(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text(json.dumps(arithmetic_rows(1)[0]) + '\n{"data_source": "arithmetic",\n')
    with pytest.raises(DataError, match=r"row 1 \(line 2\): invalid JSON"):
        read_rows(path)


def test_non_utf8_json_names_line(tmp_path):
    path = tmp_path / "x.json"
    path.write_bytes(b'[\n{"data_source": "\xff"}\n]')
    with pytest.raises(DataError, match=r"x\.json, line 2: bytes that are not UTF-8"):
        read_rows(path)


def test_json_file_must_hold_a_list(tmp_path):
    path = tmp_path / "x.json"
    path.write_text(json.dumps(arithmetic_rows(1)[0]))
    with pytest.raises(DataError, match=r"must hold a list of rows.*\.jsonl"):
        read_rows(path)


def test_missing_file_suggests_how_to_make_data(tmp_path):
    path = tmp_path / "nope" / "train.parquet"
    with pytest.raises(MissingDataFile) as info:
        read_rows(path)
    assert isinstance(info.value, FileNotFoundError) and isinstance(info.value, DataError)
    assert str(path) in str(info.value)
    assert "rlhf data prepare <task> --out DIR" in str(info.value) and "arithmetic_rows" in str(info.value)


def test_unsupported_suffix_and_bad_on_error(tmp_path):
    with pytest.raises(DataError, match=r"unsupported file type '\.csv'.*\.parquet, \.jsonl, \.json"):
        read_rows(tmp_path / "x.csv")
    with pytest.raises(DataError, match="unsupported file type"):
        write_rows(arithmetic_rows(1), tmp_path / "x.txt")
    with pytest.raises(ValueError, match='on_error must be "raise" or "skip"'):
        read_rows(tmp_path / "x.jsonl", on_error="ignore")


def test_corrupt_parquet(tmp_path):
    path = tmp_path / "x.parquet"
    path.write_bytes(b"not parquet at all")
    with pytest.raises(DataError, match=r"x\.parquet: not a readable parquet file"):
        read_rows(path)


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
def test_write_rejects_bad_rows_and_leaves_the_old_file(tmp_path, suffix):
    path = write_rows(arithmetic_rows(3), tmp_path / f"x{suffix}")
    before = path.read_bytes()
    rows = arithmetic_rows(3)
    rows[2]["prompt"] = []
    with pytest.raises(DataError, match="row 2: field 'prompt' is an empty list"):
        write_rows(rows, path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"x{suffix}"]  # no temp files left


def test_parquet_with_inconsistent_types_is_a_clear_error(tmp_path):
    rows = arithmetic_rows(2)
    rows[1]["reward_model"]["ground_truth"] = {"target": 1, "numbers": [1]}
    with pytest.raises(DataError, match="same type in every row.*jsonl"):
        write_rows(rows, tmp_path / "x.parquet")
    assert list(tmp_path.iterdir()) == []
    back, _ = read_rows(write_rows(rows, tmp_path / "x.jsonl"))
    assert back == rows


def test_jsonl_refuses_values_json_cannot_hold(tmp_path):
    import datetime

    rows = arithmetic_rows(1)
    rows[0]["extra_info"]["when"] = datetime.date(2025, 1, 1)
    with pytest.raises(DataError, match="cannot be written as JSON.*date"):
        write_rows(rows, tmp_path / "x.jsonl")
    assert list(tmp_path.iterdir()) == []


def test_zero_rows_round_trip(tmp_path):
    for suffix in (".parquet", ".jsonl", ".json"):
        rows, report = read_rows(write_rows([], tmp_path / f"empty{suffix}"))
        assert rows == [] and report.rows_total == 0
