"""Graph builders shared by experiments: a policy worker group, a tiny local model."""

from __future__ import annotations

from typing import Any

import fiddle as fdl

from rlhf.models.tiny import tiny_qwen2
from rlhf.runtime.remote import Remote
from rlhf.workers.policy import PolicyWorker
from rlhf.workers.training import TrainingSetup


def tiny_model(path: str, hidden_size: int = 64, num_layers: int = 2, seed: int = 0) -> fdl.Config:
    """A tiny Qwen2 model + byte-level tokenizer, written to `path` on first use (offline)."""
    return fdl.Config(tiny_qwen2, path=path, hidden_size=hidden_size, num_layers=num_layers,
                      intermediate_size=4 * hidden_size, seed=seed)


def policy_group(
    num_workers: int = 1, cpus_per_worker: float = 1, gpus_per_worker: float = 0,
    training: fdl.Config[TrainingSetup] | None = None,  # None: a new node with TrainingSetup's defaults
    **worker: Any,
) -> fdl.Config:
    """The policy worker group: actor + rollout + reference in one process per rank. The worker always
    gets a `training` node, so `set:...policy.worker.training.micro_batch_size=8` works on any stage."""
    return fdl.Config(
        Remote,
        name="policy",
        worker=fdl.Config(PolicyWorker, training=training if training is not None else fdl.Config(TrainingSetup),
                          **worker),
        num_workers=num_workers,
        cpus_per_worker=cpus_per_worker,
        gpus_per_worker=gpus_per_worker,
    )
