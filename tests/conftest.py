"""Test-wide settings: one torch thread (the machine is shared), offline hub, seeded hypothesis."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")

import pytest
import torch
from hypothesis import settings

torch.set_num_threads(1)
settings.register_profile("ci", deadline=None, derandomize=True, max_examples=60)
settings.load_profile("ci")


def pytest_collection_modifyitems(config, items):
    """`gpu` tests skip where there is no CUDA device, with the reason in the report."""
    import pytest

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (marked gpu); run on a GPU machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True, scope="session")
def _datasets_cache(tmp_path_factory):
    """`datasets` and the data layer's cached maps go to a temporary folder, never ~/.cache (the
    environment variable reaches subprocesses and Ray workers started by the tests)."""
    import datasets

    path = tmp_path_factory.mktemp("hf_datasets")
    before = datasets.config.HF_DATASETS_CACHE, os.environ.get("HF_DATASETS_CACHE")
    datasets.config.HF_DATASETS_CACHE = path
    os.environ["HF_DATASETS_CACHE"] = str(path)
    yield path
    datasets.config.HF_DATASETS_CACHE = before[0]
    if before[1] is None:
        os.environ.pop("HF_DATASETS_CACHE", None)
    else:
        os.environ["HF_DATASETS_CACHE"] = before[1]
