"""GSM8K's pieces for `grpo_stage` (verl's reference recipe: its scorers, the flexible score in evaluation)
and the offline `tiny` variant every RL recipe uses."""

from __future__ import annotations

from collections.abc import Callable

import fiddle as fdl

from rlhf.data.generators import gsm8k_like_rows
from rlhf.rewards.gsm8k import gsm8k_flexible
from rlhf.rewards.manager import RewardManager
from rlhf.trainers.rl import RLTrainer
from rlhf_configs.pieces import tiny_model

# GSM8K's stage (experiments/qwen_gsm8k.py) is `rlhf_configs.tasks.grpo_stage` with the scorers
# {"openai/gsm8k": gsm8k_strict} (verl's reward: 1 for a correct final `#### N`) plus `score_flexible_too`.


def score_flexible_too(stage: fdl.Config[RLTrainer]) -> None:
    """Also report GSM8K's flexible score (the last number of the response) in evaluation, as verl does."""
    stage.evaluator.aux_rewards = {"flexible": fdl.Config(RewardManager, scorers={"openai/gsm8k": gsm8k_flexible})}


def make_tiny(stage: fdl.Config[RLTrainer], model_dir: str, rows: Callable[..., list] = gsm8k_like_rows) -> None:
    """The same stage on CPU, offline: a tiny local model, generated problems (`rows(n, seed, split)`,
    GSM8K-format by default), a few steps."""
    model = tiny_model(model_dir, hidden_size=64, num_layers=2)
    worker = stage.policy.worker
    worker.model_path = worker.ref_model_path = model
    training = worker.training  # shared with the critic (use_gae_with_critic): set once for both
    training.compute_dtype = "float32"
    training.mini_batches = 1
    training.micro_batch_size = 64
    stage.policy.gpus_per_worker = 0
    if stage.critic is not None:
        stage.critic.worker.model_path = model
        stage.critic.gpus_per_worker = 0
    stage.tokenizer.name_or_path = model
    stage.train_data.rows = fdl.Config(rows, n=512, seed=0, split="train")
    stage.evaluator.dataset.rows = fdl.Config(rows, n=64, seed=0, split="test")
    stage.sampling.max_new_tokens = 32
    stage.evaluator.sampling.max_new_tokens = 32
    stage.prompts_per_step = 8
    stage.total_steps = 8
    stage.test_freq = 4
    stage.save_freq = 4
