"""`rlhf sft MODEL --data FILE ...`: the flags of `rlhf_configs.sft.sft_experiment`, its graph run, the results.

    rlhf sft MODEL --data train.parquet [--val test.parquet] [--steps 500 --batch-size 64 --lr 1e-5]
                   [--lora-rank 16 --lora-alpha 32] [--out outputs] [--local]

The flags' defaults are `sft_stage`'s, read from its source (`source_defaults`): the graph, torch
and the runtimes are imported only once the flags are parsed, so `--help` answers at once.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from rlhf.cli.source_defaults import source_defaults

__all__ = ["add_run_flags", "sft_main", "sft_parser"]


def sft_parser() -> argparse.ArgumentParser:
    """The flags; defaults come from `sft_stage`'s signature (and `LoRA`'s for the help of --lora-alpha)."""
    d = source_defaults("rlhf_configs.sft", "sft_stage")
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
    p.add_argument("--no-bucketing", action="store_true", help="random batches instead of length-bucketed ones")
    add_run_flags(p, d, "sft")
    return p


def add_run_flags(p: argparse.ArgumentParser, d: dict, stage: str) -> None:
    """The flags a training command shares (`rlhf sft`, `rlhf dpo`): workers, dtype, LoRA, output, runtime,
    tracking; `d` is the stage builder's defaults, `stage` its name in the output path."""
    p.add_argument("--workers", type=int, default=d["workers"], help="data-parallel policy workers (Ray)")
    p.add_argument("--gpus-per-worker", type=float, default=d["gpus_per_worker"])
    p.add_argument("--compute-dtype", default=d["compute_dtype"], choices=["float32", "bfloat16"],
                   help="matmul dtype (autocast); the trained weights and optimizer state stay float32")
    alpha = source_defaults("rlhf.workers.lora", "LoRA")["alpha"]
    p.add_argument("--lora-rank", type=int, default=None,
                   help="train a LoRA adapter of this rank instead of all weights; None: full fine-tuning")
    p.add_argument("--lora-alpha", type=float, default=None,
                   help=f"with --lora-rank: the adapter's output is scaled by alpha / rank; None: {alpha:g}")
    p.add_argument("--out", default="outputs", help=f"output folder: <out>/{stage}/<time>/{stage}/final is the model")
    p.add_argument("--local", action="store_true", help="run in this process (LocalRuntime), not on Ray")
    p.add_argument("--aim-repo", default=None, help="record the run in this Aim repo (None: no tracking)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def sft_main(argv: Sequence[str]) -> int:
    """Parse, build the graph (`sft_experiment`, then --no-bucketing and the LoRA fiddler), run, print results."""
    p = sft_parser()
    a = p.parse_args(argv)
    if a.accuracy and a.val is None:
        p.error("--accuracy needs --val FILE (prompt rows)")
    if a.lora_alpha is not None and a.lora_rank is None:
        p.error("--lora-alpha needs --lora-rank")
    from rlhf.runtime.experiment import run_experiment
    from rlhf.runtime.preflight import PreflightError
    from rlhf_configs.common import lora
    from rlhf_configs.sft import sft_experiment

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
