"""FSDP2, applied by the project: the same sharding on GPUs (NCCL) and on CPUs (gloo, in tests).

Accelerate (1.15) silently drops its FSDP plugin on a CPU and on one GPU without `LOCAL_RANK`
(measured: `distributed_type == NO`, docs/fsdp.md), so the project calls `torch.distributed.fsdp.fully_shard` itself:
each decoder layer, then the root, with fp32 master weights and
`MixedPrecisionPolicy(param_dtype=<compute dtype>, reduce_dtype=float32)`. Accelerate still sets
up processes and devices. World size 1 is a real process group of one rank, so a graph runs
the same sharded code under LocalRuntime as under RayRuntime with one worker.

Frozen models (reference, reward) are sharded too, without an optimizer, and every model is
read from disk once: rank 0 loads the weights, the other ranks build the module on the meta
device and receive their shards by broadcast (`build_sharded`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Collection
from typing import Literal

import torch
import torch.distributed as dist
from torch import nn

from rlhf.models.loading import ModelSource

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class FSDP:
    """FSDP2 settings; `strategy="fsdp"` means `FSDP()`."""

    cpu_offload: bool = False  # sharded parameters, gradients and optimizer state live in host RAM (GPU only)
    reshard_after_forward: bool = True  # free gathered layers after forward (ZeRO-3); False: keep them (ZeRO-2)


Strategy = Literal["auto", "ddp", "fsdp"] | FSDP


def resolve_strategy(strategy: Strategy, cuda_available: bool) -> Literal["ddp"] | FSDP:
    """`auto` is FSDP on GPUs and DDP on CPUs; `"fsdp"` is `FSDP()`, on any device."""
    if isinstance(strategy, FSDP):
        chosen: Literal["ddp"] | FSDP = strategy
    elif strategy == "auto":
        chosen = FSDP() if cuda_available else "ddp"
    elif strategy == "fsdp":
        chosen = FSDP()
    elif strategy == "ddp":
        chosen = "ddp"
    else:
        raise ValueError(f"unknown strategy {strategy!r}; choose 'auto', 'ddp', 'fsdp' or FSDP(...)")
    if isinstance(chosen, FSDP) and chosen.cpu_offload and not cuda_available:
        raise ValueError("FSDP(cpu_offload=True) moves GPU memory to the host, and this worker has no GPU; "
                         "use FSDP() on CPUs")
    return chosen


def strategy_name(strategy: Literal["ddp"] | FSDP) -> str:
    return "fsdp" if isinstance(strategy, FSDP) else strategy


def process_group_backend(cuda: bool) -> str:
    """The torch.distributed backend of every process group here: gloo on CPUs; on GPUs NCCL for CUDA
    tensors AND gloo for CPU tensors (torchtitan's and verl's setting). Under FSDP with CPU offload the
    shards, their gradients and the norm that clips them live on the host, so the gradient norm, the
    weight gather for export and for a rollout engine's sync all run collectives on CPU tensors, which
    an NCCL-only group (what Accelerate builds) cannot do."""
    return "cpu:gloo,cuda:nccl" if cuda else "gloo"


def init_process_group_from_env() -> bool:
    """Initialise the default process group from torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK,
    MASTER_ADDR, MASTER_PORT: what RayRuntime sets in each actor) with `process_group_backend`,
    before Accelerate would build an NCCL-only one; returns whether this call initialised it."""
    if dist.is_initialized() or not {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR"} <= os.environ.keys():
        return False
    dist.init_process_group(backend=process_group_backend(torch.cuda.is_available()))
    return True


def ensure_process_group() -> None:
    """A process group for this process: the runtime's (initialised from RANK, WORLD_SIZE,
    MASTER_ADDR... by `init_process_group_from_env`) or, where there is none, one of a single rank."""
    if not dist.is_initialized():
        dist.init_process_group(backend=process_group_backend(torch.cuda.is_available()), store=dist.HashStore(),
                                rank=0, world_size=1)


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The repeated blocks FSDP shards one by one: modules whose class a Hugging Face model names
    in `_no_split_modules` (Qwen2DecoderLayer, LlamaDecoderLayer...), found through wrappers (PEFT)
    and after sharding (`fully_shard` renames a class Qwen2DecoderLayer -> FSDPQwen2DecoderLayer)."""
    names: set[str] = set()
    for module in model.modules():
        names.update(getattr(module, "_no_split_modules", None) or ())
    return [m for m in model.modules() if type(m).__name__.removeprefix("FSDP") in names]


def shard_model(model: nn.Module, fsdp: FSDP, device: torch.device, param_dtype: torch.dtype | None) -> nn.Module:
    """`fully_shard` each decoder layer, then the root, over all ranks of the default process group.

    `param_dtype`: the dtype layers compute in after all-gather (None: the stored dtype); gradients
    are reduce-scattered in float32 and the sharded masters keep the stored dtype.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    ensure_process_group()
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    options = dict(
        mesh=mesh,
        mp_policy=MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32),
        offload_policy=CPUOffloadPolicy(pin_memory=device.type == "cuda") if fsdp.cpu_offload else OffloadPolicy(),
    )
    layers = decoder_layers(model)
    if not layers:
        log.warning("FSDP: %s names no decoder layer class (_no_split_modules); sharding it as one unit, "
                    "which gathers all its weights at once", type(model).__name__)
    for layer in layers:
        fully_shard(layer, reshard_after_forward=fsdp.reshard_after_forward, **options)
    fully_shard(model, **options)
    return model


def build_sharded(
    load: Callable[[], nn.Module], skeleton: Callable[[], nn.Module], shard: Callable[[nn.Module], nn.Module],
    device: torch.device, shard_device: torch.device | None = None,
) -> nn.Module:
    """A sharded model whose weights were read from disk by rank 0 only.

    `load()` builds the model with its weights (called on rank 0); `skeleton()` builds the same
    module tree (called on every rank under the meta device, so it allocates nothing); `shard`
    applies FSDP to it. The other ranks receive their shards by broadcast, then every buffer
    outside the state dict (rotary frequencies) comes from rank 0 too. `shard_device`: where the
    shards live (the host under CPU offload; default `device`); buffers always go to `device`.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    ensure_process_group()
    rank = dist.get_rank()
    full = load() if rank == 0 else None
    with torch.device("meta"):
        model = skeleton()
    model = shard(model)
    model.to_empty(device=shard_device or device)
    for module in model.modules():  # buffers are not sharded or offloaded: they compute on `device`
        for name, buffer in list(module.named_buffers(recurse=False)):
            setattr(module, name, buffer.to(device))
    state = dict(full.state_dict()) if full is not None else {}  # a copy: the call replaces its values
    set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    source = dict(full.named_buffers()) if full is not None else {}
    for name, buffer in model.named_buffers():
        if full is not None:
            buffer.copy_(source[name].to(buffer.device, buffer.dtype))
        if dist.get_world_size() > 1:
            dist.broadcast(buffer, src=0)
    del full, state, source
    return model


def is_sharded(model: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def local_parameter_bytes(model: nn.Module) -> int:
    """Bytes of the parameters this rank holds (its shards under FSDP, everything otherwise)."""
    total = 0
    for p in model.parameters():
        local = local_tensor(p)
        total += local.numel() * local.element_size()
    return total


def source_parameter_bytes(skeleton: Callable[[], nn.Module]) -> int:
    """Bytes of a model's parameters, counted on a meta-device build (nothing is allocated or read)."""
    with torch.device("meta"):
        model = skeleton()
    return sum(p.numel() * p.element_size() for p in model.parameters())


def describe_placement(
    strategy: Strategy, on_gpu: bool, world_size: int, models: dict[str, Callable[[], ModelSource]],
    whole: Collection[str] = (),
) -> str:
    """One line for a plan: the strategy, world size, and each model's parameter bytes per rank
    (FSDP divides them over the ranks, except the models named in `whole`, which every rank holds
    entire: a rollout engine's own copy). `models`: name -> its source, built lazily: a model made by
    an earlier stage does not exist yet when the plan is printed, and its size is then unknown."""
    chosen = resolve_strategy(strategy, on_gpu)
    sizes = []
    for name, source in models.items():
        try:
            total = source_parameter_bytes(source().skeleton)
        except (OSError, TypeError, ValueError):  # a path unknown before the run (None), or not written yet
            sizes.append(f"{name} size known when the stage starts")
            continue
        per_rank = total / world_size if isinstance(chosen, FSDP) and name not in whole else total
        sizes.append(f"{name} {_mb(per_rank)} per rank of {_mb(total)}")
    return f"strategy {strategy_name(chosen)}, world size {world_size}: " + ", ".join(sizes)


def _mb(n: float) -> str:
    return f"{n / 2**20:.3f} MB" if n < 2**30 else f"{n / 2**30:.2f} GB"


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of an FSDP parameter (no communication), else `t`."""
    to_local = getattr(t, "to_local", None)
    return to_local() if to_local is not None else t


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor of an FSDP shard (a collective: every rank must call it), else `t`."""
    gather = getattr(t, "full_tensor", None)
    return gather() if gather is not None else t
