"""Algorithm switches applied to an RL stage graph (the estimator, critic and KL placement)."""

from __future__ import annotations

import fiddle as fdl
import torch

from rlhf.algos import GAE, ClippedValueLoss, FixedKLController
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
