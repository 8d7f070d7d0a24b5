"""Numerical precision of a worker's models: fp32 master weights, a separate compute dtype.

Trainable weights and their optimizer state are always stored in float32 (master
weights). A bf16 weight of magnitude 0.02 has an ulp of ~8e-5, so an AdamW step of ~1e-6
(RL learning rates) rounds away: measured, 10 such steps change 1.9% of bf16 weights and
99.99% of fp32 ones. Speed comes from the *compute* dtype instead: matrix products run in
bf16 under `torch.autocast` (the same code on CPU and GPU), and frozen models (reference,
reward model) may be stored in it. A trainable model stored in bf16 is refused, at preflight
and at construction, with the fix.
"""

from __future__ import annotations

import contextlib
from typing import Literal, get_args

import torch

DType = Literal["float32", "bfloat16", "float16"]
DTYPES: tuple[str, ...] = get_args(DType)


def torch_dtype(name: str, field: str = "dtype") -> torch.dtype:
    """The torch dtype named `name` ("float32", "bfloat16", "float16"); a clear error otherwise."""
    if name not in DTYPES:
        raise ValueError(f"{field}={name!r} is not a supported dtype; choose one of {', '.join(DTYPES)}")
    return getattr(torch, name)


def check_trainable_precision(owner: str, dtype: str, compute_dtype: str) -> None:
    """Refuse settings under which a trained model cannot learn (see the module docstring).

    owner: the component's name for the message, e.g. "PolicyWorker".
    """
    torch_dtype(dtype, f"{owner}.dtype")
    torch_dtype(compute_dtype, f"{owner}.training.compute_dtype")
    if dtype != "float32":
        raise ValueError(
            f"{owner}.dtype={dtype!r} stores the trained weights in {dtype}: AdamW updates at RL learning "
            f"rates (~1e-6) round away in {dtype} (one step changes ~1% of the weights). Set "
            f"{owner}.dtype='float32' (fp32 master weights and optimizer state) and "
            f"{owner}.training.compute_dtype='bfloat16' for bf16 speed."
        )
    if compute_dtype == "float16":
        raise ValueError(
            f"{owner}.training.compute_dtype='float16' needs loss scaling to train, which rlhf does not do. "
            f"Use {owner}.training.compute_dtype='bfloat16' (same speed on GPUs that have it, no scaling needed)."
        )


def autocast(device: torch.device, compute_dtype: str) -> contextlib.AbstractContextManager:
    """Matrix products in `compute_dtype` on `device` (weights stay as stored); no-op for float32.

    Inside one autocast region a weight is cast once and reused (autocast's cast cache), so a
    decoding loop under it runs on a bf16 copy of the weights made once per call.
    """
    dtype = torch_dtype(compute_dtype, "compute_dtype")
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=dtype)
