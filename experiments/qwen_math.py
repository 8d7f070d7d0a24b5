"""GRPO on MATH with Qwen2.5-0.5B-Instruct, scored by the last \\boxed{} answer (`math_score`).

Needs the model (hub id or local folder; Qwen/Qwen2.5-Math-1.5B works the same) and verl-format
MATH parquet files (`~/data/math/{train,test}.parquet`, from `rlhf data prepare math --out ~/data/math`
or verl's examples/data_preprocess/math_dataset.py: data_source
"DigitalLearningGmbH/MATH-lighteval", the problem + "Let's think step by step and output the
final answer within \\boxed{}."). The `tiny` fiddler runs this very graph on CPU, offline, with a
tiny local model and generated MATH-format problems:

    python experiments/qwen_math.py                                 # GPU, model + data reachable
    python experiments/qwen_math.py --config fiddler:tiny --config fiddler:local \
        --config fiddler:no_tracking                                # CPU, offline
"""

from __future__ import annotations

import os
import sys

import fiddle as fdl

from rlhf.rewards.math import MATH_SOURCES, math_score
from rlhf.runtime.experiment import Experiment
from rlhf_configs.gsm8k import make_tiny
from rlhf_configs.tasks import grpo_experiment, grpo_stage, math_like_rows

NAME = "qwen_math"


def base(model: str = "Qwen/Qwen2.5-0.5B-Instruct", data_dir: str = "~/data/math") -> fdl.Config[Experiment]:
    stage = grpo_stage(
        model,
        os.path.expanduser(data_dir),
        scorers={source: math_score for source in MATH_SOURCES},
        name="math",
        max_prompt_length=1024,  # MATH problems run longer than GSM8K's
        max_new_tokens=1024,
        n=5,
        prompts_per_step=256,
        total_steps=435,  # ~15 epochs of MATH's 7500 training problems
    )
    return grpo_experiment(NAME, stage)


def tiny(cfg: fdl.Config[Experiment]) -> None:
    """The same graph on CPU, offline: a tiny local model, generated MATH-format problems, a few steps."""
    stage = cfg.stages["grpo"]
    make_tiny(stage, f"outputs/{NAME}/tiny-init-h64-l2", rows=math_like_rows)


if __name__ == "__main__":
    from rlhf.cli.experiment import run_cli

    run_cli(sys.modules[__name__])
