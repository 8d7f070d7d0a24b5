"""GRPO on GSM8K with Qwen2.5-0.5B-Instruct (verl's reference recipe, on our graph).

Needs the model (hub id or local folder) and verl-format GSM8K parquet files
(`rlhf data prepare gsm8k --out ~/data/gsm8k`, or verl's examples/data_preprocess/gsm8k.py).
Offline, it stops before training with what is missing and how to run offline; the `tiny`
fiddler runs this very graph on CPU with a tiny local model and generated GSM8K-format
word problems:

    python experiments/qwen_gsm8k.py                          # GPU, model + data reachable
    python experiments/qwen_gsm8k.py --config fiddler:tiny      # CPU, offline, under a minute
"""

from __future__ import annotations

import os
import sys

import fiddle as fdl

from rlhf.runtime.experiment import Experiment
from rlhf.runtime.ray_runtime import RayRuntime
from rlhf.tracking.aim_tracker import AimTracker
from rlhf_configs.gsm8k import gsm8k_rl_stage, make_tiny

NAME = "qwen_gsm8k"


def base(model: str = "Qwen/Qwen2.5-0.5B-Instruct", data_dir: str = "~/data/gsm8k") -> fdl.Config[Experiment]:
    return fdl.Config(
        Experiment,
        name=NAME,
        stages={"grpo": gsm8k_rl_stage(model, os.path.expanduser(data_dir))},
        runtime=fdl.Config(RayRuntime),
        tracker=fdl.Config(AimTracker, repo=".aim", experiment=NAME),
    )


def tiny(cfg: fdl.Config[Experiment]) -> None:
    """The same graph on CPU, offline: a tiny local model, generated GSM8K-format problems, a few steps."""
    make_tiny(cfg.stages["grpo"], f"outputs/{NAME}/tiny-init-h64-l2")


if __name__ == "__main__":
    from rlhf.config.cli import run_cli

    run_cli(sys.modules[__name__])
