"""TinyZero: GRPO on Countdown from the Qwen2.5-3B base model (the "aha moment" reproduction, on our graph).

Needs the model (hub id or local folder) and verl-format Countdown parquet files
(`~/data/countdown/{train,test}.parquet`, as TinyZero's examples/data_preprocess/countdown.py
writes them, or `rlhf data prepare countdown --out ~/data/countdown`). The reward is
TinyZero's: 1 for an equation in <answer></answer> that uses each number once and hits the
target, 0.1 for a well-formed wrong one. The `tiny` fiddler runs this very graph on CPU,
offline, with a tiny local model and generated puzzles:

    python experiments/countdown_tinyzero.py                        # GPU, model + data reachable
    python experiments/countdown_tinyzero.py --config fiddler:tiny --config fiddler:local \
        --config fiddler:no_tracking                                # CPU, offline
"""

from __future__ import annotations

import os
import sys

import fiddle as fdl

from rlhf.data.generators import countdown_rows
from rlhf.rewards.countdown import countdown_score
from rlhf.runtime.experiment import Experiment
from rlhf_configs.gsm8k import make_tiny
from rlhf_configs.tasks import grpo_experiment, grpo_stage

NAME = "countdown_tinyzero"


def base(model: str = "Qwen/Qwen2.5-3B", data_dir: str = "~/data/countdown") -> fdl.Config[Experiment]:
    # TinyZero's run: 256 prompts a step, prompts <= 256 tokens, responses <= 1024, lr 1e-6, KL 0.001.
    stage = grpo_stage(
        model,
        os.path.expanduser(data_dir),
        scorers={"countdown": fdl.Partial(countdown_score, format_score=0.1)},
        name="countdown",
        max_prompt_length=256,
        max_new_tokens=1024,
        n=5,
        prompts_per_step=256,
        total_steps=300,
    )
    stage.policy.worker.training.micro_batch_size = 8  # 3B with 1.2k-token sequences
    stage.policy.worker.training.mini_batches = 2  # 128 prompts per optimizer step, as TinyZero's ppo_mini_batch_size
    return grpo_experiment(NAME, stage)


def tiny(cfg: fdl.Config[Experiment]) -> None:
    """The same graph on CPU, offline: a tiny local model, generated 3-number puzzles, a few steps."""
    stage = cfg.stages["grpo"]
    make_tiny(stage, f"outputs/{NAME}/tiny-init-h64-l2", rows=countdown_rows)
    # The byte-level tiny tokenizer spends a token per character: TinyZero's prompt is ~330 tokens.
    stage.train_data.max_prompt_length = stage.evaluator.dataset.max_prompt_length = 448


if __name__ == "__main__":
    from rlhf.cli.experiment import run_cli

    run_cli(sys.modules[__name__])
