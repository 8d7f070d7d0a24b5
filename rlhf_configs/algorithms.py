"""Algorithm switches applied to an RL stage graph (the estimator, critic and KL placement, a teacher)."""

from __future__ import annotations

from typing import Any

import fiddle as fdl
import torch

from rlhf.algos import GAE, ClippedValueLoss, FixedKLController, OnPolicyDistillation, TopKForwardKL
from rlhf.runtime.remote import Remote
from rlhf.trainers.rl import RLTrainer
from rlhf.workers.critic import CriticWorker


def use_gae_with_critic(
    stage: fdl.Config[RLTrainer], critic_lr: float = 1e-5, gamma: float = 1.0, lam: float = 1.0, kl_coef: float = 0.001
) -> None:
    """Classic PPO: a critic group colocated with the policy, GAE advantages, KL as a reward penalty.
    The critic shares the policy's `training` node (compute dtype, micro- and mini-batches, ...), so a
    later override of it reaches both; only the optimizer (`critic_lr`) is the critic's own."""
    worker = stage.policy.worker
    stage.critic = fdl.Config(
        Remote,
        name="critic",
        worker=fdl.Config(
            CriticWorker,
            model_path=worker.model_path,
            value_loss=fdl.Config(ClippedValueLoss, clip_range=0.5),
            optimizer=fdl.Partial(torch.optim.AdamW, lr=critic_lr),
            training=worker.training,  # the same node: fiddle shares it, not a copy of its values
        ),
        num_workers=stage.policy.num_workers,
        cpus_per_worker=stage.policy.cpus_per_worker,
        gpus_per_worker=stage.policy.gpus_per_worker,
        colocate_with="policy",
    )
    stage.advantage = fdl.Config(GAE, gamma=gamma, lam=lam)
    stage.kl_in_reward = fdl.Config(FixedKLController, coef=kl_coef)
    worker.objective.kl_loss = None


def use_distillation(
    stage: fdl.Config[RLTrainer], teacher: Any, distill_coef: float = 1.0, task_reward: bool = False,
    top_k: int = 0, top_k_coef: float = 1.0,
) -> None:
    """On-policy distillation (docs/distillation.md): the policy worker gets a frozen `teacher` (a model folder
    with the policy's tokenizer, or an earlier stage's output) beside its reference, and the advantage becomes
    the per-token reverse KL to it x `distill_coef`; `task_reward`: plus the stage's own task advantage (OPD +
    GRPO). `top_k` > 0 adds the forward KL over the teacher's top-k tokens to the loss (x `top_k_coef`).
    Sampling, the reward (still scored and logged) and the policy loss are left as they are."""
    worker = stage.policy.worker
    worker.teacher_model_path = teacher
    task = stage.advantage
    if isinstance(task, fdl.Buildable) and fdl.get_callable(task) is OnPolicyDistillation:
        task = task.task  # applied again: the task estimator the first application kept (or None)
    stage.advantage = fdl.Config(OnPolicyDistillation, distill_coef=distill_coef,
                                 task=task if task_reward else None)
    if top_k:
        worker.objective.distill_loss = fdl.Config(TopKForwardKL, k=top_k, coef=top_k_coef)
