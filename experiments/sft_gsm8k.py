"""SFT of Qwen2.5-0.5B (base) on GSM8K worked solutions, with validation loss and strict accuracy.

Trains on verl-format GSM8K parquet files (`rlhf data prepare gsm8k --out ~/data/gsm8k`): the
prompt is the question + verl's instruction, the target is `extra_info.answer`, the worked
solution ending in "#### N". Every `test_freq` steps it logs `val/sft_loss` on the test split
and greedy strict accuracy (`val-core/openai/gsm8k/reward/mean@1`, flexible as `val-aux/...`).
`final/` is a Hugging Face model an RL stage starts from (`then_grpo`); its Aim run is the
RL run's parent. The `tiny` fiddler runs the same graph offline on CPU in about two minutes.

    python experiments/sft_gsm8k.py                                  # GPU, model + data reachable
    python experiments/sft_gsm8k.py --config fiddler:tiny --config fiddler:local   # CPU, offline
    python experiments/sft_gsm8k.py --config fiddler:then_grpo       # SFT, then GRPO from its checkpoint
"""

from __future__ import annotations

import os
import sys

import fiddle as fdl

from rlhf.data.generators import gsm8k_like_rows
from rlhf.data.prompts import PromptDataset
from rlhf.data.sources import load_rows
from rlhf.rewards.gsm8k import gsm8k_flexible, gsm8k_strict
from rlhf.rewards.manager import RewardManager
from rlhf.rollout.sampling import SamplingParams
from rlhf.runtime.experiment import Experiment
from rlhf.runtime.ray_runtime import RayRuntime
from rlhf.runtime.remote import StageOutput
from rlhf.tracking.aim_tracker import AimTracker
from rlhf.trainers.evaluate import Evaluator
from rlhf_configs.gsm8k import score_flexible_too
from rlhf_configs.pieces import tiny_model
from rlhf_configs.sft import sft_stage
from rlhf_configs.tasks import grpo_stage

NAME = "sft_gsm8k"


def gsm8k_evaluator(tokenizer: fdl.Config, path: str) -> fdl.Config[Evaluator]:
    """Greedy strict `#### N` accuracy on GSM8K test prompts (flexible last-number scoring beside it)."""
    return fdl.Config(
        Evaluator,
        dataset=fdl.Config(PromptDataset, rows=fdl.Config(load_rows, path=path), tokenizer=tokenizer,
                           name="gsm8k-test"),
        reward=fdl.Config(RewardManager, scorers={"openai/gsm8k": gsm8k_strict}),
        aux_rewards={"flexible": fdl.Config(RewardManager, scorers={"openai/gsm8k": gsm8k_flexible})},
        sampling=fdl.Config(SamplingParams, temperature=0.0, max_new_tokens=512),
    )


def base(model: str = "Qwen/Qwen2.5-0.5B", data_dir: str = "~/data/gsm8k") -> fdl.Config[Experiment]:
    data_dir = os.path.expanduser(data_dir)
    sft = sft_stage(
        model, f"{data_dir}/train.parquet", f"{data_dir}/test.parquet",
        steps=350,  # 3 epochs of 7473 solutions at 64 per step
        batch_size=64, micro_batch_size=8, lr=1e-5, warmup_steps=10, max_length=1024, response_key="answer",
        test_freq=50, save_freq=100, gpus_per_worker=1,
    )
    sft.policy.worker.training.compute_dtype = "bfloat16"  # fp32 master weights, bf16 compute
    sft.evaluator = gsm8k_evaluator(sft.data.tokenizer, f"{data_dir}/test.parquet")
    return fdl.Config(
        Experiment,
        name=NAME,
        stages={"sft": sft},
        runtime=fdl.Config(RayRuntime),
        tracker=fdl.Config(AimTracker, repo=".aim", experiment=NAME),
    )


def tiny(cfg: fdl.Config[Experiment]) -> None:
    """The same graph on CPU, offline: a tiny local model, generated GSM8K-format problems, ~2 minutes."""
    model = tiny_model(f"outputs/{NAME}/tiny-init-h64-l2", hidden_size=64, num_layers=2)
    sft = cfg.stages["sft"]
    sft.policy.worker.model_path = model
    sft.policy.worker.training.compute_dtype = "float32"
    sft.policy.worker.optimizer.lr = 3e-3
    sft.policy.worker.training.micro_batch_size = 16
    sft.policy.gpus_per_worker = 0
    sft.data.tokenizer.name_or_path = model
    sft.data.rows = fdl.Config(gsm8k_like_rows, n=512, seed=0, split="train")
    sft.data.max_length = 512  # the tiny model's context
    sft.val_data.rows = fdl.Config(gsm8k_like_rows, n=64, seed=0, split="test")
    sft.val_data.max_length = 512
    sft.evaluator.dataset.rows = fdl.Config(gsm8k_like_rows, n=16, seed=0, split="test")
    sft.evaluator.sampling.max_new_tokens = 256
    sft.batch_size = 16
    sft.total_steps = 40
    sft.policy.worker.lr_scheduler.num_training_steps = 40
    sft.test_freq = 20
    sft.save_freq = 20


def then_grpo(cfg: fdl.Config[Experiment], data_dir: str = "~/data/gsm8k") -> None:
    """A second stage: GRPO on GSM8K starting from the SFT checkpoint (the RL run's Aim parent is the SFT run)."""
    checkpoint = fdl.Config(StageOutput, stage="sft")
    stage = grpo_stage(checkpoint, os.path.expanduser(data_dir), scorers={"openai/gsm8k": gsm8k_strict}, name="gsm8k",
                       total_steps=435)  # 15 epochs of 7473 problems at 256 per step
    score_flexible_too(stage)
    cfg.stages["grpo"] = stage


if __name__ == "__main__":
    from rlhf.cli.experiment import run_cli

    run_cli(sys.modules[__name__])
