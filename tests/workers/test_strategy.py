"""Strategy choice: auto is DDP on CPU and FSDP on GPU; "fsdp" is FSDP on any device (gloo on CPUs)."""

import pytest

from rlhf.workers.fsdp import FSDP, resolve_strategy


@pytest.mark.parametrize(
    "strategy, cuda, expected",
    [("auto", False, "ddp"), ("auto", True, FSDP()), ("ddp", False, "ddp"), ("ddp", True, "ddp"),
     ("fsdp", True, FSDP()), ("fsdp", False, FSDP()), (FSDP(reshard_after_forward=False), False,
                                                      FSDP(reshard_after_forward=False))],
)
def test_resolve_strategy(strategy, cuda, expected):
    assert resolve_strategy(strategy, cuda) == expected


def test_cpu_offload_needs_a_gpu():
    assert resolve_strategy(FSDP(cpu_offload=True), True) == FSDP(cpu_offload=True)
    with pytest.raises(ValueError, match="cpu_offload=True.*no GPU"):
        resolve_strategy(FSDP(cpu_offload=True), False)


@pytest.mark.parametrize("bad", ["zero3", "FSDP", None])
def test_unknown_strategy(bad):
    with pytest.raises(ValueError, match="unknown strategy"):
        resolve_strategy(bad, False)
