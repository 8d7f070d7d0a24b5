"""`rlhf dpo MODEL --data FILE ...`: `rlhf_configs.dpo.dpo_experiment`'s graph, its knob flags, the run, the results.

    rlhf dpo MODEL --data train.parquet [--val test.parquet] [--loss sigmoid|robust|ipo|simpo|rpo --beta 0.1]
                   [--steps 200 --batch-size 16 --lr 1e-6] [--lora-rank 16] [set:PATH=VALUE ...] [--out outputs]

The graph is built from the inputs (MODEL, --data, --val and the loss with its options, which decide the nodes);
every knob flag is an alias of the `set:` override `--help` shows beside it (`DPO_FLAGS`, as for `rlhf sft`), and
any other `set:` or `fiddler:` word may follow. The defaults shown are `dpo_stage`'s, read from its source
(`source_defaults`), so `--help` answers without importing torch, the graph or the runtimes.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from rlhf.cli.graph_flags import HelpFormatter, add_graph_flags, apply_graph_flags, split_overrides, training_flags
from rlhf.cli.sft import add_lora_flags, add_output_flags, lora_fiddler
from rlhf.cli.source_defaults import source_defaults

__all__ = ["DPO_FLAGS", "dpo_graph", "dpo_main", "dpo_parser"]

LOSS_NAMES = ("sigmoid", "robust", "ipo", "simpo", "rpo")  # rlhf_configs.dpo.LOSSES (kept free of its imports)
S = "stages.dpo"


def _dpo_flags():
    d = dict(source_defaults("rlhf_configs.dpo", "dpo_stage"))
    d["micro_batch_size"] *= 2  # the builder counts pairs; the worker's micro-batch counts rows
    return training_flags(d, S, f"{S}.policy", "rows (2 per pair; a pair's rows always share one)")


DPO_FLAGS = _dpo_flags()


def dpo_parser() -> argparse.ArgumentParser:
    """The inputs (the loss and its options among them), the knob flags (`DPO_FLAGS`), LoRA and the run options."""
    p = argparse.ArgumentParser(prog="rlhf dpo", formatter_class=HelpFormatter,
                                usage="rlhf dpo MODEL --data FILE [options] [set:PATH=VALUE ...] [fiddler:NAME ...]",
                                description="Learn from preference pairs with a DPO-family loss (docs/preferences.md).")
    inputs = p.add_argument_group("inputs (they decide which nodes the graph has)")
    inputs.add_argument("model", help="model folder or hub id to train (also the reference, except with --loss simpo)")
    inputs.add_argument("--data", required=True, help="preference pairs: .parquet / .jsonl / .json or a datasets "
                                                      "folder (prompt, chosen, rejected; TRL's layouts)")
    inputs.add_argument("--val", default=None, help="held-out pairs for val/dpo_loss, val/rewards/...")
    inputs.add_argument("--loss", default="sigmoid", choices=LOSS_NAMES,
                        help="sigmoid: DPO; robust: robust DPO (noisy labels); ipo: IPO; simpo: SimPO (no "
                             "reference); rpo: DPO + NLL of the chosen answer")
    inputs.add_argument("--beta", type=float, default=None,
                        help="the loss's beta (None: its default; DPO 0.1, SimPO 2)")
    inputs.add_argument("--label-smoothing", type=float, default=None,
                        help="sigmoid: cDPO's label noise; robust: the share of flipped labels (None: the loss's)")
    inputs.add_argument("--simpo-gamma", type=float, default=None, help="simpo: the target reward margin (None: 1.0)")
    inputs.add_argument("--rpo-alpha", type=float, default=None, help="rpo: the weight of the chosen NLL (None: 1.0)")
    add_graph_flags(p, DPO_FLAGS)
    add_lora_flags(p)  # with --lora-rank the reference is the base with the adapter disabled
    add_output_flags(p, "dpo")
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


def dpo_graph(argv: Sequence[str]):
    """The graph `rlhf dpo ARGV` runs: `dpo_experiment` of the inputs, then the knob flags as their `set:`
    overrides, then --lora-rank's fiddler, then the command line's `set:`/`fiddler:` words, in order."""
    p = dpo_parser()
    argv, overrides = split_overrides(argv)
    a = p.parse_args(argv)
    try:
        options = loss_options(a)
    except ValueError as err:
        p.error(str(err))
    from rlhf_configs.dpo import dpo_experiment, preference_loss

    graph = dpo_experiment(a.model, a.data, a.val, out=a.out, local=a.local, aim_repo=a.aim_repo,
                           progress=not a.quiet, loss=preference_loss(a.loss, **options))
    return apply_graph_flags(p, graph, a, DPO_FLAGS, [*lora_fiddler(p, a), *overrides])


def dpo_main(argv: Sequence[str]) -> int:
    """Build the graph (`dpo_graph`), run it, print the results."""
    graph = dpo_graph(argv)
    from rlhf.runtime.experiment import run_experiment
    from rlhf.runtime.preflight import PreflightError

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
