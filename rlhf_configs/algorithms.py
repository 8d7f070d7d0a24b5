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
    """Classic PPO: a critic group colocated with the policy, GAE advantages, KL as a reward penalty."""
    worker = stage.policy.worker
    stage.critic = fdl.Config(
        Remote,
        name="critic",
        worker=fdl.Config(
            CriticWorker,
            model_path=worker.model_path,
            value_loss=fdl.Config(ClippedValueLoss, clip_range=0.5),
            optimizer=fdl.Partial(torch.optim.AdamW, lr=critic_lr),
            compute_dtype=worker.compute_dtype,
            micro_batch_size=worker.micro_batch_size,
            mini_batches=worker.mini_batches,
        ),
        num_workers=stage.policy.num_workers,
        cpus_per_worker=stage.policy.cpus_per_worker,
        gpus_per_worker=stage.policy.gpus_per_worker,
        colocate_with="policy",
    )
    stage.advantage = fdl.Config(GAE, gamma=gamma, lam=lam)
    stage.kl_in_reward = fdl.Config(FixedKLController, coef=kl_coef)
    worker.objective.kl_loss = None
