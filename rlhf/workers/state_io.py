"""A trained model's resumable state as a sharded `torch.distributed.checkpoint` (DCP): one format for
a plain module, DDP and FSDP2, at any world size.

A worker's state folder (the driver's checkpoint folder gives its path, e.g. `step_00000010/policy`):

    dcp/.metadata, dcp/__<rank>_0.distcp   model + optimizer: each rank writes its own shards
                                            (DDP replicas are written once), rank 0 the metadata
    scheduler.pt                            LR scheduler state (rank 0; identical on every rank)
    rng/rank_<rank>.pt                      every rank's RNG states: python, numpy, torch CPU, CUDA

Nothing is gathered: a 7B policy's checkpoint costs each rank its shard of I/O, not a full copy.
Only what a resume cannot get elsewhere is written: a trained model's frozen parameters (the base
model under a LoRA adapter) come from its model path again when the worker is rebuilt, so they
are left out, and a tied weight (`lm_head.weight` = `model.embed_tokens.weight`) is written once,
under its first name. The frozen reference policy is never part of a checkpoint.
`torch.distributed.checkpoint.state_dict.get_state_dict / set_state_dict` give the same
fully-qualified names whatever the wrapper, so a checkpoint written under DDP resumes under
FSDP and back, and at another world size (the model and optimizer are resharded on load; RNG
states then cannot match the ranks and are left as they are, with a warning).

The folder is written in place: crash safety comes from the driver (rlhf.trainers.checkpoint
writes every worker into a temporary folder, manifests it, renames it). RNG and scheduler
files hold plain tensors, numbers and lists, so they load with `torch.load(weights_only=True)`.

Checkpoints in Accelerate's former format (`model.safetensors`, `optimizer.bin`,
`random_states_<rank>.pkl`) still load where they were written, under DDP, through Accelerate;
under FSDP they raise `CheckpointFormatError`, which says how to convert them.
"""

from __future__ import annotations

import contextlib
import logging
import random
import warnings
from pathlib import Path
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

log = logging.getLogger(__name__)

DCP_DIR = "dcp"
SCHEDULER_FILE = "scheduler.pt"
RNG_DIR = "rng"
_ACCELERATE_FILES = ("random_states_0.pkl", "optimizer.bin")


class CheckpointFormatError(RuntimeError):
    """A checkpoint in a format this configuration cannot load; retrying an older one will not help
    (rlhf.trainers.checkpoint lets it through instead of falling back)."""


class CheckpointIOError(RuntimeError):
    """torch.distributed.checkpoint could not write or read a checkpoint; the message names the folder and each
    rank's cause (e.g. `OSError: [Errno 28] No space left on device`), the first cause is `__cause__`'s.

    DCP raises `CheckpointException`, which derives from `BaseException`: every `except Exception` (the
    checkpoint fallback, a disk-full report, `rlhf export`) would let it through as a crash. `_dcp_errors`
    turns it into this exception where DCP is called.
    """


@contextlib.contextmanager
def _dcp_errors(action: str, folder: Path):
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        yield
    except CheckpointException as err:
        causes = {rank: exc for rank, (exc, _) in err.failures.items()}
        lines = [f"rank {rank}: {type(exc).__name__}: {_first_line(exc)}" for rank, exc in sorted(causes.items())]
        first = next(iter(causes.values()), None)
        raise CheckpointIOError(f"{action} {folder} failed ({'; '.join(lines) or err})") from (first or err)


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0][:300] if text else ""


def is_dcp_state(folder: str | Path) -> bool:
    return (Path(folder) / DCP_DIR / ".metadata").is_file()


def is_accelerate_state(folder: str | Path) -> bool:
    """A state folder written by `Accelerator.save_state` (rlhf before sharded checkpoints)."""
    folder = Path(folder)
    return not is_dcp_state(folder) and any((folder / name).is_file() for name in _ACCELERATE_FILES)


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


@contextlib.contextmanager
def _quiet_single_process():
    """DCP warns that it "assumes a single process" whenever no process group exists: here that
    is the intent (DDP at world size 1, `rlhf export`), not a mistake to report on every save."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
        yield


def _barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def _inner(optimizer: torch.optim.Optimizer | None) -> torch.optim.Optimizer | None:
    """The torch optimizer under Accelerate's wrapper (whose state DCP reads by parameter)."""
    return getattr(optimizer, "optimizer", optimizer)


def saved_keys(model: nn.Module, trained: bool) -> set[str]:
    """The model-state keys a checkpoint holds: every parameter once (a tied weight under its first
    name) and the buffers; of a `trained` model only the trainable parameters (its frozen ones, a
    LoRA adapter's base model, are rebuilt from the model path)."""
    keys = {name for name, p in model.named_parameters() if p.requires_grad or not trained}
    return keys | {name for name, _ in model.named_buffers()}


def _kept(state: dict[str, Any], keys: set[str]) -> dict[str, Any]:
    return {k: v for k, v in state.items() if k in keys}


def save_state(
    folder: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer | None = None,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
) -> None:
    """Write `model` (and `optimizer`, `scheduler`, this rank's RNG states) to `folder`; with an
    optimizer, only the trainable parameters (`saved_keys`).

    Every rank of the default process group must call it (without one: a single process).
    """
    from torch.distributed.checkpoint import save
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    folder = Path(folder)
    rank = _rank()
    optim = _inner(optimizer)
    keys = saved_keys(model, trained=optim is not None)
    if optim is None:
        state: dict[str, Any] = {"model": _kept(get_model_state_dict(model), keys)}
    else:
        # DCP fills an empty optimizer state by a zero-lr step (Adam's step count becomes 1);
        # the state of an optimizer that never stepped is then not saved, so resume starts it empty too.
        stepped = bool(optim.state)
        model_state, optim_state = get_state_dict(model, optim)
        if not stepped:
            optim.state.clear()
        state = {"model": _kept(model_state, keys), "optimizer": optim_state}
    folder.mkdir(parents=True, exist_ok=True)
    with _quiet_single_process(), _dcp_errors("writing", folder / DCP_DIR):
        save(state, checkpoint_id=str(folder / DCP_DIR))
    (folder / RNG_DIR).mkdir(exist_ok=True)
    torch.save(rng_state(), folder / RNG_DIR / f"rank_{rank:05d}.pt")
    if rank == 0:
        extra = {"optimizer_stepped": optim is not None and stepped,
                 "scheduler": scheduler.state_dict() if scheduler is not None else None}
        torch.save(extra, folder / SCHEDULER_FILE)
    _barrier()  # the folder is complete when every rank returns


def load_state(
    folder: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer | None = None,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
) -> None:
    """Restore what `save_state` wrote into the live (possibly sharded) `model`, `optimizer` and
    `scheduler`, and this rank's RNG states. Every rank must call it."""
    from torch.distributed.checkpoint import load
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions, get_model_state_dict, get_state_dict, set_model_state_dict, set_state_dict,
    )

    folder = Path(folder)
    if not is_dcp_state(folder):
        raise FileNotFoundError(f"{folder} holds no sharded checkpoint ({DCP_DIR}/.metadata is missing)")
    extra = torch.load(folder / SCHEDULER_FILE, weights_only=True)
    optim = _inner(optimizer)
    keys = saved_keys(model, trained=optim is not None)
    partial = StateDictOptions(strict=False)  # what is not read (frozen, tied) stays as built
    if optim is None:
        state: dict[str, Any] = {"model": _kept(get_model_state_dict(model), keys)}
        with _quiet_single_process(), _dcp_errors("reading", folder / DCP_DIR):
            load(state, checkpoint_id=str(folder / DCP_DIR))
        set_model_state_dict(model, state["model"], options=partial)
    else:
        model_state, optim_state = get_state_dict(model, optim)  # the shapes and shards to read into
        state = {"model": _kept(model_state, keys), "optimizer": optim_state}
        with _quiet_single_process(), _dcp_errors("reading", folder / DCP_DIR):
            load(state, checkpoint_id=str(folder / DCP_DIR))
        set_state_dict(model, optim, model_state_dict=state["model"], optim_state_dict=state["optimizer"],
                       options=partial)
        if not extra["optimizer_stepped"]:
            optim.state.clear()
    if scheduler is not None:
        if extra["scheduler"] is None:
            raise CheckpointFormatError(f"{folder} was saved without an LR scheduler, and this run has one; "
                                        "resume with the same lr_scheduler the checkpoint was written with")
        scheduler.load_state_dict(extra["scheduler"])
    rank = _rank()
    rng_file = folder / RNG_DIR / f"rank_{rank:05d}.pt"
    if rng_file.is_file():
        set_rng_state(torch.load(rng_file, weights_only=True))
    else:
        log.warning("%s has no RNG state for rank %d (it was written at a smaller world size): the weights and "
                    "optimizer are restored, the random streams are not, so this run will not repeat the "
                    "original one exactly", folder, rank)
    _barrier()


def rng_state() -> dict[str, Any]:
    """This process's RNG states as tensors, numbers and lists (loadable with weights_only=True)."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    state = {
        "python": [version, list(internal), gauss_next],
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def read_model_state(folder: str | Path, model: nn.Module) -> None:
    """Load the weights of a DCP state folder into an unsharded `model`, in this process alone (no
    process group: `rlhf export` on a machine without the training's ranks). What is read is
    `saved_keys(model, trained=True)`: give a LoRA checkpoint's `model` its base weights and a fresh
    adapter, and the adapter is read; a tied weight is read once and stays tied."""
    from torch.distributed.checkpoint import load

    keys = saved_keys(model, trained=True)
    state = {"model": _kept(model.state_dict(), keys)}
    with _quiet_single_process(), _dcp_errors("reading", Path(folder) / DCP_DIR):
        load(state, checkpoint_id=str(Path(folder) / DCP_DIR), no_dist=True)
    missing, unexpected = model.load_state_dict(state["model"], strict=False)
    if unexpected or keys & set(missing):
        raise KeyError(f"{folder}: the checkpoint's weights do not fit the model (missing {sorted(keys & set(missing))[:5]}, "
                       f"unexpected {sorted(unexpected)[:5]})")


def unsharded_copy(
    model: nn.Module, full_state: dict[str, torch.Tensor], skeleton: Callable[[], nn.Module],
) -> nn.Module:
    """A whole, unsharded copy of `model` on the host, for what needs a plain module (PEFT's
    adapter save and merge): `skeleton()` builds the same module tree (called under the meta
    device), `full_state` (`ModelTrainer.full_state_dict()`, rank 0) gives its weights, and the
    buffers outside the state dict (rotary frequencies) come from `model`, whose buffers FSDP2
    keeps whole on every rank."""
    with torch.device("meta"):
        copy = skeleton()
    copy.load_state_dict(full_state, assign=True)  # strict: a key the skeleton lacks is an error
    live = {name: full_buffer for name, full_buffer in model.named_buffers()}
    for name, buffer in list(copy.named_buffers()):
        if buffer.is_meta:
            owner, _, attr = name.rpartition(".")
            copy.get_submodule(owner)._buffers[attr] = live[name].detach().to("cpu", copy=True)
    if hasattr(copy, "tie_weights"):  # assign=True loaded tied weights as two tensors
        copy.tie_weights()
    return copy
