"""A data file's fingerprint: size and sha256, recomputed when the file changes, reused while it does not."""

import os
import time

from rlhf.io.fingerprint import content_fingerprint, file_stat


def test_the_same_bytes_give_the_same_fingerprint_and_a_same_size_rewrite_another(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text('{"x": 1}\n')
    b.write_text('{"x": 1}\n')
    assert content_fingerprint(a) == content_fingerprint(b)
    assert content_fingerprint(a).startswith("9 bytes, sha256 ")
    before = content_fingerprint(a)
    a.write_text('{"x": 2}\n')  # same size, other bytes
    assert content_fingerprint(a) != before
    assert content_fingerprint(tmp_path / "none") == "missing"


def test_a_recorded_fingerprint_is_reused_only_while_size_and_mtime_match(tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text("one\n")
    assert file_stat(data) is None  # just written: within one mtime tick a rewrite could look the same
    old = time.time_ns() - 60 * 10**9
    os.utime(data, ns=(old, old))
    recorded = (file_stat(data), "recorded")  # what a run record kept from an earlier process
    assert content_fingerprint(data, known=recorded) == "recorded"  # not read again
    data.write_text("two\n")
    assert content_fingerprint(data, known=recorded).startswith("4 bytes, sha256 ")


def test_a_folder_covers_every_file_and_its_name(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "train.parquet").write_bytes(b"abc")
    first = content_fingerprint(tmp_path / "d")
    assert first.startswith("1 files, 3 bytes, sha256 ")
    (tmp_path / "d" / "train.parquet").rename(tmp_path / "d" / "test.parquet")
    assert content_fingerprint(tmp_path / "d") != first
