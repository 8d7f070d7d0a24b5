"""Test-wide settings: one torch thread (the machine is shared), offline hub, seeded hypothesis."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")

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
