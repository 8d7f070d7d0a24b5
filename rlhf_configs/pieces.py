"""Graph builders shared by experiments: a policy worker group, a tiny local model, a one-stage experiment."""

from __future__ import annotations

from typing import Any

import fiddle as fdl

from rlhf.models.tiny import tiny_qwen2
from rlhf.runtime.experiment import Experiment
from rlhf.runtime.local import LocalRuntime
from rlhf.runtime.ray_runtime import RayRuntime
from rlhf.runtime.remote import Remote
from rlhf.tracking.aim_tracker import AimTracker
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


def one_stage_experiment(name: str, stage: fdl.Config, *, out: str | None = None, local: bool = False,
                         aim_repo: str | None = None, progress: bool = True) -> fdl.Config[Experiment]:
    """The experiment of a one-stage command (`rlhf sft`, `dpo`, `rm`, `generate`, `eval`, `probe`): the stage
    named `name`, in this process (`local`) or on Ray, recorded in Aim under `name` when `aim_repo` is given."""
    graph = fdl.Config(
        Experiment,
        name=name,
        stages={name: stage},
        runtime=fdl.Config(LocalRuntime if local else RayRuntime),
        tracker=fdl.Config(AimTracker, repo=aim_repo, experiment=name) if aim_repo else None,
        progress=progress,
    )
    if out is not None:
        graph.output_dir = out
    return graph
