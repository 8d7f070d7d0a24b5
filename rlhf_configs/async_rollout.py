"""Asynchronous rollout on an RL stage graph: a rollout group of its own, a bounded-staleness queue, and the
decoupled PPO objective (docs/async.md). The shared fiddlers `one_step_off` and `streaming`
(rlhf_configs.common) apply it to every RL stage of any recipe."""

from __future__ import annotations

from typing import Literal

import fiddle as fdl

from rlhf.algos import DecoupledPPO, RolloutCorrection
from rlhf.choices import check_choice
from rlhf.runtime.remote import Remote
from rlhf.trainers.async_rollout import AsyncRollout, OnStale, Transport, Weights
from rlhf.trainers.rl import RLTrainer
from rlhf.workers.rollout import RolloutWorker

Placement = Literal["separate", "colocated"]
Correction = Literal["bypass", "decoupled"]


def use_async_rollout(
    stage: fdl.Config[RLTrainer],
    max_staleness: int = 1,
    on_stale: OnStale = "wait",
    weights: Weights = "newest",
    placement: Placement = "separate",
    transport: Transport = "auto",
    rollout_workers: int | None = None,
    correction: Correction = "bypass",
    partial_rollouts: bool = False,
) -> None:
    """Roll out in a group named "rollout" running the policy's engine on its own copy of the weights.

    placement "separate": the group has its own resources (as many CPUs/GPUs per worker as the policy's),
    so generation overlaps training; "colocated": it shares the policy's bundles and takes turns with the
    trainer (one device). `rollout_workers`: ranks of a separate group (None: as many as the policy's;
    a colocated group always has the policy's). A stale sample needs its behaviour log-probs in the loss:
    unless the stage already corrects for the behaviour policy, `correction` "bypass" sets
    `rollout_correction=RolloutCorrection(bypass=True)` (the PPO ratio against the policy that sampled:
    prime-rl's and TRL's asynchronous default, and the one that held up here, docs/async.md) and
    "decoupled" the objective's `DecoupledPPO()` (AReaL's). `partial_rollouts`: multi-turn conversations outlive
    their batch and continue on newer weights (AsyncRollout's argument; streaming only).
    """
    check_choice("use_async_rollout: placement", placement, Placement)
    check_choice("use_async_rollout: correction", correction, Correction)
    policy = stage.policy
    worker = policy.worker
    colocated = placement == "colocated"
    if colocated and rollout_workers not in (None, policy.num_workers):
        raise ValueError(f"a colocated rollout group has the policy's {policy.num_workers} workers (rank r shares "
                         f"bundle r); drop rollout_workers={rollout_workers} or use placement='separate'")
    stage.async_rollout = fdl.Config(
        AsyncRollout,
        rollout=fdl.Config(
            Remote,
            name="rollout",
            worker=fdl.Config(RolloutWorker, model_path=worker.model_path, engine=worker.engine,
                              dtype=worker.training.compute_dtype),  # the dtype the hybrid engine would use
            num_workers=policy.num_workers if colocated or rollout_workers is None else rollout_workers,
            cpus_per_worker=policy.cpus_per_worker,
            gpus_per_worker=policy.gpus_per_worker,
            colocate_with="policy" if colocated else None,
        ),
        max_staleness=max_staleness,
        on_stale=on_stale,
        weights=weights,
        transport=transport,
        partial_rollouts=partial_rollouts,
    )
    if stage.rollout_correction is None and worker.objective.decoupled is None:
        if correction == "bypass":
            stage.rollout_correction = fdl.Config(RolloutCorrection, bypass=True)
        else:
            worker.objective.decoupled = fdl.Config(DecoupledPPO)
