"""Accelerate owns device placement and the distributed wrapper of every trained model.

Accelerate silently falls back to DDP when asked for FSDP on a CPU, so the strategy is
checked here and a CPU + FSDP request is an error instead of a surprise.
"""

from __future__ import annotations

from typing import Literal

import torch
from accelerate import Accelerator

Strategy = Literal["auto", "ddp", "fsdp"]


def resolve_strategy(strategy: Strategy, cuda_available: bool) -> Literal["ddp", "fsdp"]:
    """`auto` is FSDP on GPUs and DDP on CPUs; FSDP on a CPU is refused."""
    if strategy == "auto":
        return "fsdp" if cuda_available else "ddp"
    if strategy == "fsdp" and not cuda_available:
        raise ValueError(
            "strategy='fsdp' needs GPUs, and this worker has none: Accelerate would silently fall back "
            "to DDP on CPU. Use strategy='ddp' or 'auto' (DDP on CPU, FSDP on GPU)."
        )
    if strategy not in ("ddp", "fsdp"):
        raise ValueError(f"unknown strategy {strategy!r}; choose 'auto', 'ddp' or 'fsdp'")
    return strategy


def make_accelerator(strategy: Strategy = "auto") -> Accelerator:
    """An Accelerator for this process (torch.distributed env vars are set by the runtime).

    Precision is not Accelerate's business here: its `mixed_precision` only autocasts (no fp32
    masters for a model loaded in bf16) and under FSDP2 reduces gradients in bf16. The trainer
    autocasts itself (rlhf.workers.precision).
    """
    cuda = torch.cuda.is_available()
    chosen = resolve_strategy(strategy, cuda)
    if chosen == "fsdp":
        from accelerate.utils import FullyShardedDataParallelPlugin

        plugin = FullyShardedDataParallelPlugin(
            fsdp_version=2,
            reshard_after_forward=True,
            auto_wrap_policy="transformer_based_wrap",
            state_dict_type="FULL_STATE_DICT",
        )
        return Accelerator(fsdp_plugin=plugin)
    return Accelerator(cpu=not cuda)
