"""SFT graph pieces: one SFT stage over data files, and the graph + command line of `rlhf sft`.

    rlhf sft MODEL --data train.parquet [--val test.parquet] [--steps 500 --batch-size 64 --lr 1e-5]
                   [--lora-rank 16 --lora-alpha 32] [--out outputs] [--local]

Rows are verl prompt rows (the response is the ground truth, or `extra_info[--response-key]`)
or chat rows with `messages` (the loss covers the assistant turns). The final checkpoint is
`<out>/sft/<time>/sft/final`, a Hugging Face folder an RL stage can start from (with `--lora-rank`,
the merged model; the adapter alone is `final-adapter`).
"""

from __future__ import annotations

import argparse
import inspect
import sys
from collections.abc import Sequence

import fiddle as fdl
import torch
from transformers import get_cosine_schedule_with_warmup

from rlhf.data.prompts import PromptDataset
from rlhf.data.sft import SFTDataset, answer_from_extra_info, answer_from_ground_truth, load_sft_rows
from rlhf.models.loading import load_tokenizer
from rlhf.rewards import RewardManager, default_scorers
from rlhf.rollout.sampling import SamplingParams
from rlhf.runtime.experiment import Experiment, run_experiment
from rlhf.runtime.local import LocalRuntime
from rlhf.runtime.preflight import PreflightError
from rlhf.runtime.ray_runtime import RayRuntime
from rlhf.tracking.aim_tracker import AimTracker
from rlhf.trainers.evaluate import Evaluator
from rlhf.trainers.sft import SFTTrainer
from rlhf.workers.objectives import SFTObjective
from rlhf.workers.training import TrainingSetup
from rlhf.workers.lora import LoRA
from rlhf_configs.common import lora
from rlhf_configs.pieces import policy_group


def sft_stage(
    model, data, val=None, *, steps: int = 500, batch_size: int = 64, micro_batch_size: int = 8, lr: float = 1e-5,
    warmup_steps: int = 10, max_length: int = 1024, response_key: str | None = None, accuracy: bool = False,
    max_new_tokens: int = 512, test_freq: int = 50, save_freq: int = 0, workers: int = 1, gpus_per_worker: float = 0,
    compute_dtype: str = "float32",
) -> fdl.Config[SFTTrainer]:
    """An SFT stage: AdamW + cosine schedule with warmup, gradient accumulation over micro-batches,
    length-bucketed batches, `val/sft_loss` on `val` and (accuracy=True) greedy exact match on it."""
    tokenizer = fdl.Config(load_tokenizer, model)
    response = answer_from_ground_truth
    if response_key is not None:
        response = fdl.Partial(answer_from_extra_info, key=response_key)

    def dataset(path, name):
        return fdl.Config(SFTDataset, rows=fdl.Config(load_sft_rows, path=path), tokenizer=tokenizer,
                          response=response, max_length=max_length, name=name)

    evaluator = None
    if val is not None and accuracy:  # needs prompt rows whose data_source has a scorer
        evaluator = fdl.Config(
            Evaluator,
            dataset=fdl.Config(PromptDataset, rows=fdl.Config(load_sft_rows, path=val), tokenizer=tokenizer,
                               name="val"),
            reward=fdl.Config(RewardManager, scorers=fdl.Config(default_scorers)),
            sampling=fdl.Config(SamplingParams, temperature=0.0, max_new_tokens=max_new_tokens),
        )
    return fdl.Config(
        SFTTrainer,
        policy=policy_group(
            num_workers=workers,
            gpus_per_worker=gpus_per_worker,
            model_path=model,
            objective=fdl.Config(SFTObjective),
            optimizer=fdl.Partial(torch.optim.AdamW, lr=lr, weight_decay=0.01),
            lr_scheduler=fdl.Partial(get_cosine_schedule_with_warmup, num_warmup_steps=warmup_steps,
                                     num_training_steps=steps),
            training=fdl.Config(TrainingSetup, micro_batch_size=micro_batch_size,
                                compute_dtype=compute_dtype),  # weights and AdamW state stay float32
        ),
        data=dataset(data, "train"),
        val_data=dataset(val, "val") if val is not None else None,
        evaluator=evaluator,
        batch_size=batch_size,
        total_steps=steps,
        test_freq=test_freq,
        save_freq=save_freq,
    )


def sft_experiment(
    model: str, data: str, val: str | None = None, out: str = "outputs", local: bool = False,
    aim_repo: str | None = None, progress: bool = True, **stage,
) -> fdl.Config[Experiment]:
    """`rlhf sft`: one SFT stage (keyword arguments go to `sft_stage`)."""
    return fdl.Config(
        Experiment,
        name="sft",
        stages={"sft": sft_stage(model, data, val, **stage)},
        runtime=fdl.Config(LocalRuntime if local else RayRuntime),
        tracker=fdl.Config(AimTracker, repo=aim_repo, experiment="sft") if aim_repo else None,
        output_dir=out,
        progress=progress,
    )


def main(argv: Sequence[str]) -> int:
    """The `rlhf sft` command line; defaults come from `sft_stage`'s signature."""
    d = {name: p.default for name, p in inspect.signature(sft_stage).parameters.items()}
    p = argparse.ArgumentParser(prog="rlhf sft", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("model", help="model folder or hub id to fine-tune")
    p.add_argument("--data", required=True, help="training rows: .parquet / .jsonl / .json (prompt or messages rows)")
    p.add_argument("--val", default=None, help="held-out rows for val/sft_loss (and --accuracy)")
    p.add_argument("--steps", type=int, default=d["steps"], help="optimizer steps")
    p.add_argument("--batch-size", type=int, default=d["batch_size"], help="examples per step, all workers")
    p.add_argument("--micro-batch-size", type=int, default=d["micro_batch_size"],
                   help="rows per forward/backward (gradient accumulation below --batch-size)")
    p.add_argument("--lr", type=float, default=d["lr"], help="peak learning rate (cosine schedule)")
    p.add_argument("--warmup-steps", type=int, default=d["warmup_steps"], help="linear warmup steps")
    p.add_argument("--max-length", type=int, default=d["max_length"], help="longer examples are dropped")
    p.add_argument("--response-key", default=None, help="prompt rows: train on extra_info[KEY] (None: ground truth)")
    p.add_argument("--accuracy", action="store_true", help="also greedy exact-match accuracy on --val prompt rows")
    p.add_argument("--max-new-tokens", type=int, default=d["max_new_tokens"], help="for --accuracy")
    p.add_argument("--test-freq", type=int, default=d["test_freq"], help="validate every k steps (and at the end)")
    p.add_argument("--save-freq", type=int, default=d["save_freq"], help="resumable checkpoint every k steps (0: none)")
    p.add_argument("--workers", type=int, default=d["workers"], help="data-parallel policy workers (Ray)")
    p.add_argument("--gpus-per-worker", type=float, default=d["gpus_per_worker"])
    p.add_argument("--compute-dtype", default=d["compute_dtype"], choices=["float32", "bfloat16"],
                   help="matmul dtype (autocast); the trained weights and optimizer state stay float32")
    p.add_argument("--no-bucketing", action="store_true", help="random batches instead of length-bucketed ones")
    lora_defaults = {name: q.default for name, q in inspect.signature(LoRA).parameters.items()}
    p.add_argument("--lora-rank", type=int, default=None,
                   help="train a LoRA adapter of this rank instead of all weights; None: full fine-tuning")
    p.add_argument("--lora-alpha", type=float, default=None,
                   help=f"with --lora-rank: the adapter's output is scaled by alpha / rank; None: {lora_defaults['alpha']:g}")
    p.add_argument("--out", default="outputs", help="output folder: <out>/sft/<time>/sft/final is the model")
    p.add_argument("--local", action="store_true", help="run in this process (LocalRuntime), not on Ray")
    p.add_argument("--aim-repo", default=None, help="record the run in this Aim repo (None: no tracking)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    a = p.parse_args(argv)
    if a.accuracy and a.val is None:
        p.error("--accuracy needs --val FILE (prompt rows)")
    if a.lora_alpha is not None and a.lora_rank is None:
        p.error("--lora-alpha needs --lora-rank")
    graph = sft_experiment(
        a.model, a.data, a.val, out=a.out, local=a.local, aim_repo=a.aim_repo, progress=not a.quiet,
        steps=a.steps, batch_size=a.batch_size, micro_batch_size=a.micro_batch_size, lr=a.lr,
        warmup_steps=a.warmup_steps, max_length=a.max_length, response_key=a.response_key, accuracy=a.accuracy,
        max_new_tokens=a.max_new_tokens, test_freq=a.test_freq, save_freq=a.save_freq, workers=a.workers,
        gpus_per_worker=a.gpus_per_worker, compute_dtype=a.compute_dtype,
    )
    if a.no_bucketing:  # SFTTrainer.bucketed (default True) is the one default
        graph.stages["sft"].bucketed = False
    if a.lora_rank is not None:  # the same fiddler as `--config fiddler:lora(rank=...)` on any recipe
        lora(graph, rank=a.lora_rank, **({"alpha": a.lora_alpha} if a.lora_alpha is not None else {}))

    try:
        result = run_experiment(graph)["sft"]
    except PreflightError as err:
        sys.exit(f"error: {err}")
    print(f"checkpoint: {result['checkpoint']}")
    for key in sorted(k for k in result["metrics"] if k.startswith(("val", "sft/loss"))):
        print(f"{key}: {result['metrics'][key]:.4f}")
    if result.get("run_hash"):
        print(f"aim run:    {result['run_hash']}")
    return 0
