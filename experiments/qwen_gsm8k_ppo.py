"""PPO with a critic and GAE on GSM8K with Qwen2.5-0.5B-Instruct (verl's PPO recipe, on our graph).

The GRPO recipe's stage with three changes (rlhf_configs.algorithms.use_gae_with_critic):
a critic group colocated with the policy, GAE advantages, and the KL as a reward penalty.

    python experiments/qwen_gsm8k_ppo.py                       # GPU, model + data reachable
    python experiments/qwen_gsm8k_ppo.py --config fiddler:tiny   # CPU, offline
"""

from __future__ import annotations

import os
import sys

import fiddle as fdl

from rlhf.runtime.experiment import Experiment
from rlhf.runtime.ray_runtime import RayRuntime
from rlhf.tracking.aim_tracker import AimTracker
from rlhf_configs.algorithms import use_gae_with_critic
from rlhf.rewards.gsm8k import gsm8k_strict
from rlhf_configs.gsm8k import make_tiny, score_flexible_too
from rlhf_configs.tasks import grpo_stage

NAME = "qwen_gsm8k_ppo"


def base(model: str = "Qwen/Qwen2.5-0.5B-Instruct", data_dir: str = "~/data/gsm8k") -> fdl.Config[Experiment]:
    stage = grpo_stage(model, os.path.expanduser(data_dir), scorers={"openai/gsm8k": gsm8k_strict}, name="gsm8k",
                       total_steps=435)  # 15 epochs of 7473 problems at 256 per step
    score_flexible_too(stage)
    use_gae_with_critic(stage, critic_lr=1e-5)
    stage.sampling.n = 1  # PPO with a critic needs no group of samples per prompt
    stage.prompts_per_step = 1024
    return fdl.Config(
        Experiment,
        name=NAME,
        stages={"ppo": stage},
        runtime=fdl.Config(RayRuntime),
        tracker=fdl.Config(AimTracker, repo=".aim", experiment=NAME),
    )


def tiny(cfg: fdl.Config[Experiment]) -> None:
    """The same graph on CPU, offline: tiny local policy and critic, generated problems, a few steps."""
    stage = cfg.stages["ppo"]
    make_tiny(stage, f"outputs/{NAME}/tiny-init-h64-l2")
    stage.prompts_per_step = 32
    stage.critic.worker.optimizer.lr = 1e-3
    stage.policy.worker.optimizer.lr = 1e-4


if __name__ == "__main__":
    from rlhf.cli.experiment import run_cli

    run_cli(sys.modules[__name__])
