"""Strategy choice: auto is DDP on CPU and FSDP on GPU; FSDP on a CPU is refused, not downgraded."""

import pytest
import torch

from rlhf.workers.accelerator import make_accelerator, resolve_strategy


@pytest.mark.parametrize(
    "strategy, cuda, expected",
    [("auto", False, "ddp"), ("auto", True, "fsdp"), ("ddp", False, "ddp"), ("ddp", True, "ddp"), ("fsdp", True, "fsdp")],
)
def test_resolve_strategy(strategy, cuda, expected):
    assert resolve_strategy(strategy, cuda) == expected


def test_fsdp_on_cpu_is_a_clear_error(monkeypatch):
    with pytest.raises(ValueError, match="needs GPUs.*silently fall back to DDP"):
        resolve_strategy("fsdp", False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # as on a CPU machine, also where CUDA exists
    with pytest.raises(ValueError, match="needs GPUs"):
        make_accelerator("fsdp")


def test_unknown_strategy():
    with pytest.raises(ValueError, match="unknown strategy"):
        resolve_strategy("zero3", False)
