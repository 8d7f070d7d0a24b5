"""Accelerate owns process and device setup and the DDP wrapper of every trained model.

FSDP is not asked of Accelerate: its plugin is silently dropped on a CPU and on one GPU without
`LOCAL_RANK`, so the project applies FSDP2 itself (rlhf.workers.fsdp) on an Accelerator that
only sets up processes and devices.
"""

from __future__ import annotations

import torch
from accelerate import Accelerator

from rlhf.workers.fsdp import FSDP, Strategy, resolve_strategy  # noqa: F401 - the strategy's public home
from rlhf.workers.fsdp import init_process_group_from_env

__all__ = ["FSDP", "Strategy", "make_accelerator", "resolve_strategy"]


def make_accelerator() -> Accelerator:
    """An Accelerator for this process (torch.distributed env vars are set by the runtime).

    Precision is not Accelerate's business here: its `mixed_precision` only autocasts (no fp32
    masters for a model loaded in bf16) and under FSDP2 reduces gradients in bf16. The trainer
    autocasts itself (rlhf.workers.precision) and FSDP's policy reduces in float32.

    The process group is initialised first, here (`init_process_group_from_env`): on GPUs Accelerate
    would make it NCCL-only, and FSDP's CPU offload needs gloo beside NCCL (`process_group_backend`).
    Accelerate then uses the group it finds.
    """
    init_process_group_from_env()
    return Accelerator(cpu=not torch.cuda.is_available())
