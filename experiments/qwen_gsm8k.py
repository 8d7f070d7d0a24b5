"""GRPO on GSM8K with Qwen2.5-0.5B-Instruct (verl's reference recipe, on our graph).

Needs the model (hub id or local folder) and verl-format GSM8K parquet files
(`rlhf data prepare gsm8k --out ~/data/gsm8k`, or verl's examples/data_preprocess/gsm8k.py).
Offline, it stops before training with what is missing and how to run offline; the `tiny`
fiddler runs this very graph on CPU with a tiny local model and generated GSM8K-format
word problems:

    python experiments/qwen_gsm8k.py                          # GPU, model + data reachable
    python experiments/qwen_gsm8k.py --config fiddler:tiny      # CPU, offline, minutes
"""

from __future__ import annotations

import os
import sys

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
from rlhf.runtime.experiment import Experiment
from rlhf.runtime.ray_runtime import RayRuntime
from rlhf.tracking.aim_tracker import AimTracker
from rlhf.trainers.evaluate import Evaluator
from rlhf.trainers.rl import RLTrainer
from rlhf.workers.objectives import PolicyObjective
from rlhf_configs.pieces import policy_group, tiny_model

NAME = "qwen_gsm8k"
DATA_DIR = os.path.expanduser("~/data/gsm8k")


def base(model: str = "Qwen/Qwen2.5-0.5B-Instruct", data_dir: str = DATA_DIR) -> fdl.Config[Experiment]:
    tokenizer = fdl.Config(load_tokenizer, model)
    strict = fdl.Config(RewardManager, scorers={"openai/gsm8k": gsm8k_strict})
    flexible = fdl.Config(RewardManager, scorers={"openai/gsm8k": gsm8k_flexible})
    grpo = fdl.Config(
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
            dtype="bfloat16",
            micro_batch_size=16,
            mini_batches=4,  # 1024 samples per step -> 4 optimizer steps of 256
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
    )
    return fdl.Config(
        Experiment,
        name=NAME,
        stages={"grpo": grpo},
        runtime=fdl.Config(RayRuntime),
        tracker=fdl.Config(AimTracker, repo=".aim", experiment=NAME),
    )


def tiny(cfg: fdl.Config[Experiment]) -> None:
    """The same graph on CPU, offline: a tiny local model, generated GSM8K-format problems, a few steps."""
    grpo = cfg.stages["grpo"]
    model = tiny_model("outputs/qwen_gsm8k/tiny-init-h64-l2", hidden_size=64, num_layers=2)
    worker = grpo.policy.worker
    worker.model_path = worker.ref_model_path = model
    worker.dtype = "float32"
    worker.mini_batches = 1
    worker.micro_batch_size = 64
    grpo.policy.gpus_per_worker = 0
    grpo.tokenizer.name_or_path = model
    grpo.train_data.rows = fdl.Config(gsm8k_like_rows, n=512, seed=0, split="train")
    grpo.evaluator.dataset.rows = fdl.Config(gsm8k_like_rows, n=64, seed=0, split="test")
    grpo.sampling.max_new_tokens = 32
    grpo.evaluator.sampling.max_new_tokens = 32
    grpo.prompts_per_step = 8
    grpo.total_steps = 8
    grpo.test_freq = 4


if __name__ == "__main__":
    from rlhf.config.cli import run_cli

    run_cli(sys.modules[__name__])
