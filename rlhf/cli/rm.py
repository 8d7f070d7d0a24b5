"""`rlhf rm MODEL --data PAIRS ...`: the flags of `rlhf_configs.reward_model.rm_experiment`, its graph run, the results.

    rlhf rm MODEL --data pairs.jsonl [--val heldout.jsonl] [--steps 500 --batch-size 32 --lr 1e-5]
                  [--lora-rank 16 --lora-alpha 32] [--out outputs]

The flags' defaults are `rm_stage`'s, read from its source (`source_defaults`): the graph, torch and the runtimes
are imported only once the flags are parsed, so `--help` answers at once.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from rlhf.argtypes import POSITIVE, number
from rlhf.cli.graph_flags import apply_graph_flags, split_overrides
from rlhf.cli.source_defaults import source_defaults

__all__ = ["rm_main", "rm_parser"]


def rm_parser() -> argparse.ArgumentParser:
    """The flags; defaults come from `rm_stage`'s signature."""
    d = source_defaults("rlhf_configs.reward_model", "rm_stage")
    p = argparse.ArgumentParser(prog="rlhf rm", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                                description="Train a reward model (a one-label score head on MODEL) on preference "
                                            "pairs with the Bradley-Terry loss (docs/preferences.md).")
    p.add_argument("model", help="model folder or hub id to start from (a causal LM: the policy or an SFT checkpoint)")
    p.add_argument("--data", required=True,
                   help="preference pairs: .parquet / .jsonl / .json or a datasets folder (prompt, chosen, rejected)")
    p.add_argument("--val", default=None, help="held-out pairs for rm/accuracy, rm/margin, rm/chosen_mean, ...")
    p.add_argument("--steps", type=POSITIVE, default=d["steps"], help="optimizer steps")
    p.add_argument("--batch-size", type=POSITIVE, default=d["batch_size"], help="pairs per step, all workers")
    p.add_argument("--micro-batch-size", type=POSITIVE, default=d["micro_batch_size"],
                   help="rows per forward/backward (2 per pair; a pair's rows always share one)")
    p.add_argument("--max-tokens-per-micro-batch", type=POSITIVE, default=d["max_tokens_per_micro_batch"],
                   help="cut micro-batches by this token budget instead (rows grouped by length)")
    p.add_argument("--lr", type=number(float, 0, low_open=True), default=d["lr"], help="peak learning rate (cosine schedule)")
    p.add_argument("--warmup-steps", type=int, default=d["warmup_steps"], help="linear warmup steps")
    p.add_argument("--max-length", type=POSITIVE, default=d["max_length"],
                   help="prompt + completion tokens per side; longer pairs are dropped")
    p.add_argument("--center-rewards-coefficient", type=number(float, 0), default=d["center_rewards_coefficient"],
                   help="weight of the reward-centring term (TRL's; 0.01 is its documented value); None: off")
    p.add_argument("--test-freq", type=int, default=d["test_freq"], help="validate every k steps (and at the end)")
    p.add_argument("--save-freq", type=int, default=d["save_freq"], help="resumable checkpoint every k steps (0: none)")
    p.add_argument("--workers", type=POSITIVE, default=d["workers"], help="data-parallel workers (Ray)")
    p.add_argument("--gpus-per-worker", type=float, default=d["gpus_per_worker"])
    p.add_argument("--compute-dtype", default=d["compute_dtype"], choices=["float32", "bfloat16"],
                   help="matmul dtype (autocast); the trained weights and optimizer state stay float32")
    p.add_argument("--seed", type=int, default=d["seed"], help="the new score head's draw and the data order")
    alpha = source_defaults("rlhf.workers.lora", "LoRA")["alpha"]
    p.add_argument("--lora-rank", type=POSITIVE, default=None,
                   help="train a LoRA adapter of this rank (and the score head) instead of all weights; None: all")
    p.add_argument("--lora-alpha", type=float, default=None,
                   help=f"with --lora-rank: the adapter's output is scaled by alpha / rank; None: {alpha:g}")
    p.add_argument("--out", default="outputs", help="output folder: <out>/rm/<time>/rm/final is the reward model")
    p.add_argument("--local", action="store_true", help="run in this process (LocalRuntime), not on Ray")
    p.add_argument("--aim-repo", default=None, help="record the run in this Aim repo (None: no tracking)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def rm_main(argv: Sequence[str]) -> int:
    """Parse, build the graph (`rm_experiment`), run, print the folder, the reward statistics and held-out metrics."""
    p = rm_parser()
    argv, overrides = split_overrides(argv)
    a = p.parse_args(argv)
    if a.lora_alpha is not None and a.lora_rank is None:
        p.error("--lora-alpha needs --lora-rank")
    from rlhf.runtime.experiment import run_experiment
    from rlhf.runtime.preflight import PreflightError
    from rlhf_configs.common import lora
    from rlhf_configs.reward_model import rm_experiment

    graph = rm_experiment(
        a.model, a.data, a.val, out=a.out, local=a.local, aim_repo=a.aim_repo, progress=not a.quiet,
        steps=a.steps, batch_size=a.batch_size, micro_batch_size=a.micro_batch_size,
        max_tokens_per_micro_batch=a.max_tokens_per_micro_batch, lr=a.lr, warmup_steps=a.warmup_steps,
        max_length=a.max_length, center_rewards_coefficient=a.center_rewards_coefficient, test_freq=a.test_freq,
        save_freq=a.save_freq, workers=a.workers, gpus_per_worker=a.gpus_per_worker, compute_dtype=a.compute_dtype,
        seed=a.seed,
    )
    if a.lora_rank is not None:  # the same fiddler as `--config fiddler:lora(rank=...)` on any recipe
        lora(graph, rank=a.lora_rank, **({"alpha": a.lora_alpha} if a.lora_alpha is not None else {}))
    graph = apply_graph_flags(p, graph, a, (), overrides)  # the command line's set:/fiddler: words
    try:
        result = run_experiment(graph)["rm"]
    except PreflightError as err:
        sys.exit(f"error: {err}")
    print(f"reward model: {result['checkpoint']}")
    print(f"reward mean {result['reward_mean']:.4f}, std {result['reward_std']:.4f} (stored in its config.json)")
    for key in sorted(k for k in result["metrics"] if k.startswith(("rm/accuracy", "rm/margin", "val/", "rm/loss"))):
        print(f"{key}: {result['metrics'][key]:.4f}")
    if result.get("run_hash"):
        print(f"aim run:      {result['run_hash']}")
    return 0
