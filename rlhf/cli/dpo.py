"""`rlhf dpo MODEL --data FILE ...`: the flags of `rlhf_configs.dpo.dpo_experiment`, its graph run, the results.

    rlhf dpo MODEL --data train.parquet [--val test.parquet] [--loss sigmoid|robust|ipo|simpo|rpo --beta 0.1]
                   [--steps 200 --batch-size 16 --lr 1e-6] [--lora-rank 16] [--out outputs] [--local]

The flags' defaults are `dpo_stage`'s and the losses' own, read from their source (`source_defaults`), so
`--help` answers without importing torch, the graph or the runtimes.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from rlhf.cli.sft import add_run_flags
from rlhf.cli.graph_flags import apply_graph_flags, split_overrides
from rlhf.cli.source_defaults import source_defaults

__all__ = ["dpo_main", "dpo_parser"]

LOSS_NAMES = ("sigmoid", "robust", "ipo", "simpo", "rpo")  # rlhf_configs.dpo.LOSSES (kept free of its imports)


def dpo_parser() -> argparse.ArgumentParser:
    """The flags; defaults come from `dpo_stage`'s signature (loss options: None keeps the loss's own default)."""
    d = source_defaults("rlhf_configs.dpo", "dpo_stage")
    p = argparse.ArgumentParser(prog="rlhf dpo", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                                description="Learn from preference pairs with a DPO-family loss (docs/preferences.md).")
    p.add_argument("model", help="model folder or hub id to train (also the reference, except with --loss simpo)")
    p.add_argument("--data", required=True, help="preference pairs: .parquet / .jsonl / .json or a datasets folder "
                                                 "(prompt, chosen, rejected; TRL's layouts)")
    p.add_argument("--val", default=None, help="held-out pairs for val/dpo_loss, val/rewards/...")
    p.add_argument("--loss", default="sigmoid", choices=LOSS_NAMES,
                   help="sigmoid: DPO; robust: robust DPO (noisy labels); ipo: IPO; simpo: SimPO (no reference); "
                        "rpo: DPO + NLL of the chosen answer")
    p.add_argument("--beta", type=float, default=None, help="the loss's beta (None: its default; DPO 0.1, SimPO 2)")
    p.add_argument("--label-smoothing", type=float, default=None,
                   help="sigmoid: cDPO's label noise; robust: the share of flipped labels (None: the loss's default)")
    p.add_argument("--simpo-gamma", type=float, default=None, help="simpo: the target reward margin (None: 1.0)")
    p.add_argument("--rpo-alpha", type=float, default=None, help="rpo: the weight of the chosen NLL (None: 1.0)")
    p.add_argument("--steps", type=int, default=d["steps"], help="optimizer steps")
    p.add_argument("--batch-size", type=int, default=d["batch_size"], help="pairs per step, all workers")
    p.add_argument("--micro-batch-size", type=int, default=d["micro_batch_size"],
                   help="pairs per forward/backward (gradient accumulation below --batch-size)")
    p.add_argument("--lr", type=float, default=d["lr"], help="peak learning rate (cosine schedule)")
    p.add_argument("--warmup-steps", type=int, default=d["warmup_steps"], help="linear warmup steps")
    p.add_argument("--max-length", type=int, default=d["max_length"],
                   help="prompt + completion tokens per side; longer pairs are dropped (counted in a warning)")
    p.add_argument("--test-freq", type=int, default=d["test_freq"], help="validate every k steps (and at the end)")
    p.add_argument("--save-freq", type=int, default=d["save_freq"], help="resumable checkpoint every k steps (0: none)")
    add_run_flags(p, d, "dpo")  # with --lora-rank the reference is the base with the adapter disabled
    return p


def loss_options(a: argparse.Namespace) -> dict:
    """The loss node's options given on the command line (the others keep the loss's defaults)."""
    given = {"beta": a.beta, "label_smoothing": a.label_smoothing, "gamma": a.simpo_gamma, "alpha": a.rpo_alpha}
    allowed = {"sigmoid": {"beta", "label_smoothing"}, "robust": {"beta", "label_smoothing"}, "ipo": {"beta"},
               "simpo": {"beta", "gamma"}, "rpo": {"beta", "alpha"}}[a.loss]
    flags = {"beta": "--beta", "label_smoothing": "--label-smoothing", "gamma": "--simpo-gamma", "alpha": "--rpo-alpha"}
    wrong = [flags[k] for k, v in given.items() if v is not None and k not in allowed]
    if wrong:
        raise ValueError(f"{', '.join(wrong)} does not apply to --loss {a.loss}")
    return {k: v for k, v in given.items() if v is not None}


def dpo_main(argv: Sequence[str]) -> int:
    """Parse, build the graph (`dpo_experiment`, then the LoRA fiddler), run, print results."""
    p = dpo_parser()
    argv, overrides = split_overrides(argv)
    a = p.parse_args(argv)
    if a.lora_alpha is not None and a.lora_rank is None:
        p.error("--lora-alpha needs --lora-rank")
    try:
        options = loss_options(a)
    except ValueError as err:
        p.error(str(err))
    from rlhf.runtime.experiment import run_experiment
    from rlhf.runtime.preflight import PreflightError
    from rlhf_configs.common import lora
    from rlhf_configs.dpo import dpo_experiment, preference_loss

    graph = dpo_experiment(
        a.model, a.data, a.val, out=a.out, local=a.local, aim_repo=a.aim_repo, progress=not a.quiet,
        loss=preference_loss(a.loss, **options), steps=a.steps, batch_size=a.batch_size,
        micro_batch_size=a.micro_batch_size, lr=a.lr, warmup_steps=a.warmup_steps, max_length=a.max_length,
        test_freq=a.test_freq, save_freq=a.save_freq, workers=a.workers, gpus_per_worker=a.gpus_per_worker,
        compute_dtype=a.compute_dtype,
    )
    if a.lora_rank is not None:  # the same fiddler as `--config fiddler:lora(rank=...)` on any recipe
        lora(graph, rank=a.lora_rank, **({"alpha": a.lora_alpha} if a.lora_alpha is not None else {}))
    graph = apply_graph_flags(p, graph, a, (), overrides)  # the command line's set:/fiddler: words
    try:
        result = run_experiment(graph)["dpo"]
    except PreflightError as err:
        sys.exit(f"error: {err}")
    print(f"checkpoint: {result['checkpoint']}")
    for key in sorted(k for k in result["metrics"] if k.startswith(("val/", "dpo/loss", "rewards/", "logps/"))):
        print(f"{key}: {result['metrics'][key]:.4f}")
    if result.get("run_hash"):
        print(f"aim run:    {result['run_hash']}")
    return 0
