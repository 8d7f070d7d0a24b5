"""load_hf_rows: a local parquet or folder through `datasets` gives the rows and fingerprint of load_rows."""

import pytest

from rlhf.data.arrow import rows_fingerprint, to_rows
from rlhf.data.files import fingerprint_rows, read_rows, write_rows
from rlhf.data.generators import countdown_rows
from rlhf.data.hf_datasets import load_hf_rows
from rlhf.data.schema import DataError
from rlhf.data.sources import load_rows


@pytest.fixture
def parquet(tmp_path):
    return write_rows(countdown_rows(6), tmp_path / "data" / "train.parquet")


@pytest.fixture
def hf_datasets(monkeypatch):
    import datasets

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)  # never wait on the network in tests
    return datasets


def test_local_parquet_matches_read_rows(hf_datasets, parquet, tmp_path):
    rows = load_hf_rows("parquet", data_files=str(parquet), cache_dir=str(tmp_path / "cache"))
    expected, _ = read_rows(parquet)
    assert to_rows(rows) == expected
    assert rows_fingerprint(rows) == fingerprint_rows(expected) == rows_fingerprint(load_rows(str(parquet)))
    assert isinstance(to_rows(rows)[0]["prompt"], list) and isinstance(to_rows(rows)[0]["extra_info"]["index"], int)
    folder = load_hf_rows(str(parquet.parent), split="train[:2]", cache_dir=str(tmp_path / "cache"))
    assert to_rows(folder) == expected[:2]  # a local folder, a split slice


def test_bad_rows_are_reported(hf_datasets, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"question": ["1+1?"], "answer": ["2"]}), path)  # raw, not verl's schema
    with pytest.raises(DataError, match="row 0: field 'data_source' is missing"):
        load_hf_rows("parquet", data_files=str(path))


def test_unreachable_hub_says_how_to_work_offline(hf_datasets, monkeypatch):
    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'openai/gsm8k' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(hf_datasets, "load_dataset", offline)
    with pytest.raises(DataError, match="hub could not be reached.*Fix \\(offline\\).*load_rows") as info:
        load_hf_rows("openai/gsm8k", name="main")
    assert "openai/gsm8k (main) split 'train'" in str(info.value)


def test_preflight_checks_the_rows(hf_datasets, parquet, tmp_path):
    load_hf_rows.preflight({"path": "parquet", "data_files": str(parquet)})
    with pytest.raises(DataError, match="cannot be read"):
        load_hf_rows.preflight({"path": "parquet", "data_files": str(tmp_path / "missing.parquet")})
