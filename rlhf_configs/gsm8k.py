"""The GSM8K RL stage (verl's reference recipe) and its offline `tiny` variant, shared by recipes."""

from __future__ import annotations

from collections.abc import Callable

import fiddle as fdl
import torch

from rlhf.algos import GRPO, KLLoss, PPOClipLoss, kl_k3
from rlhf.data.generators import gsm8k_like_rows
from rlhf.data.prompts import PromptDataset
from rlhf.data.sources import load_rows
from rlhf.models.loading import load_tokenizer
from rlhf.rewards.gsm8k import gsm8k_flexible, gsm8k_strict
from rlhf.rewards.manager import RewardManager
from rlhf.rollout.sampling import SamplingParams
from rlhf.trainers.evaluate import Evaluator
from rlhf.trainers.rl import RLTrainer
from rlhf.workers.objectives import PolicyObjective
from rlhf_configs.pieces import policy_group, tiny_model


def gsm8k_rl_stage(model: str, data_dir: str) -> fdl.Config[RLTrainer]:
    """GRPO on verl-format GSM8K parquet files: n=5, k3 KL loss 0.001, strict `#### N` reward."""
    tokenizer = fdl.Config(load_tokenizer, model)
    strict = fdl.Config(RewardManager, scorers={"openai/gsm8k": gsm8k_strict})
    flexible = fdl.Config(RewardManager, scorers={"openai/gsm8k": gsm8k_flexible})
    return fdl.Config(
        RLTrainer,
        policy=policy_group(
            model_path=model,
            ref_model_path=model,
            objective=fdl.Config(
                PolicyObjective,
                policy_loss=fdl.Config(PPOClipLoss, clip_low=0.2, clip_high=0.2),
                kl_loss=fdl.Config(KLLoss, estimator=kl_k3, coef=0.001),
            ),
            optimizer=fdl.Partial(torch.optim.AdamW, lr=1e-6, weight_decay=0.01),
            compute_dtype="bfloat16",  # bf16 matmuls; weights and AdamW state stay fp32
            micro_batch_size=16,  # rows per forward where no token budget applies
            max_tokens_per_micro_batch=16384,  # rows grouped by length, trimmed (verl: ppo_max_token_len_per_gpu)
            mini_batches=4,  # 1280 samples per step -> 4 optimizer steps of 320
            gpus_per_worker=1,
        ),
        tokenizer=tokenizer,
        train_data=fdl.Config(
            PromptDataset,
            rows=fdl.Config(load_rows, path=f"{data_dir}/train.parquet"),
            tokenizer=tokenizer,
            max_prompt_length=512,
            name="gsm8k-train",
        ),
        reward=strict,
        advantage=fdl.Config(GRPO, norm_by_std=True),
        sampling=fdl.Config(SamplingParams, n=5, temperature=1.0, max_new_tokens=1024),
        prompts_per_step=256,
        total_steps=435,  # 15 epochs of 7473 problems at 256 per step
        evaluator=fdl.Config(
            Evaluator,
            dataset=fdl.Config(
                PromptDataset,
                rows=fdl.Config(load_rows, path=f"{data_dir}/test.parquet"),
                tokenizer=tokenizer,
                name="gsm8k-test",
            ),
            reward=strict,
            aux_rewards={"flexible": flexible},
            sampling=fdl.Config(SamplingParams, temperature=0.0, max_new_tokens=1024),
        ),
        test_freq=10,
        val_before_train=True,
        save_freq=20,
    )


def make_tiny(stage: fdl.Config[RLTrainer], model_dir: str, rows: Callable[..., list] = gsm8k_like_rows) -> None:
    """The same stage on CPU, offline: a tiny local model, generated problems (`rows(n, seed, split)`,
    GSM8K-format by default), a few steps."""
    model = tiny_model(model_dir, hidden_size=64, num_layers=2)
    worker = stage.policy.worker
    worker.model_path = worker.ref_model_path = model
    worker.compute_dtype = "float32"
    worker.mini_batches = 1
    worker.micro_batch_size = 64
    stage.policy.gpus_per_worker = 0
    if stage.critic is not None:
        stage.critic.worker.model_path = model
        stage.critic.worker.compute_dtype = "float32"
        stage.critic.worker.mini_batches = 1
        stage.critic.worker.micro_batch_size = 64
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
