"""load_hf_rows: local parquet through `datasets` equals read_rows; clear errors without it or offline."""

import sys

import pytest

from rlhf.data.files import fingerprint_rows, read_rows, write_rows
from rlhf.data.generators import countdown_rows
from rlhf.data.hf_datasets import load_hf_rows
from rlhf.data.schema import DataError


@pytest.fixture
def parquet(tmp_path):
    return write_rows(countdown_rows(6), tmp_path / "data" / "train.parquet")


@pytest.fixture
def hf_datasets(monkeypatch, tmp_path):
    datasets = pytest.importorskip("datasets")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")  # no writes to ~/.cache
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)  # never wait on the network in tests
    return datasets


def test_local_parquet_matches_read_rows(hf_datasets, parquet):
    rows = load_hf_rows("parquet", data_files=str(parquet))
    expected, _ = read_rows(parquet)
    assert rows == expected and fingerprint_rows(rows) == fingerprint_rows(expected)
    assert isinstance(rows[0]["prompt"], list) and isinstance(rows[0]["extra_info"]["index"], int)
    assert load_hf_rows(str(parquet.parent), split="train[:2]") == expected[:2]  # a local folder, a split slice


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


def test_missing_package_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # `import datasets` now raises ImportError
    with pytest.raises(ImportError, match="pip install datasets.*load_rows"):
        load_hf_rows("parquet", data_files="x.parquet")
    with pytest.raises(ImportError, match="not installed"):
        load_hf_rows.preflight({"path": "openai/gsm8k"})
