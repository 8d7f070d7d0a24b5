"""`rlhf sft MODEL --data FILE ...`: `rlhf_configs.sft.sft_experiment`'s graph, its knob flags, the run, the results.

    rlhf sft MODEL --data train.parquet [--val test.parquet] [--steps 500 --batch-size 64 --lr 1e-5]
                   [--lora-rank 16 --lora-alpha 32] [set:PATH=VALUE ...] [--out outputs] [--local]

The graph is built from the inputs (MODEL, --data, --val, --response-key, --accuracy); every knob flag is
an alias of the `set:` override `--help` shows beside it (`SFT_FLAGS`, `rlhf.cli.graph_flags`), and any
other `set:` or `fiddler:` word may follow. The defaults shown are `sft_stage`'s, read from its source
(`source_defaults`): the graph, torch and the runtimes are imported only once the flags are parsed.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from rlhf.cli.graph_flags import (GraphFlag, HelpFormatter, add_graph_flags, apply_graph_flags, split_overrides,
                                  training_flags)
from rlhf.cli.source_defaults import source_defaults

__all__ = ["SFT_FLAGS", "add_lora_flags", "add_output_flags", "lora_fiddler", "sft_graph", "sft_main", "sft_parser"]

S = "stages.sft"


def sft_flags(d: dict) -> tuple[GraphFlag, ...]:
    """The knob flags of `rlhf sft` and their paths in the graph; `d`: `sft_stage`'s defaults, for --help."""
    return (
        *training_flags(d, S, f"{S}.policy", "rows"),
        GraphFlag("--max-new-tokens", (f"{S}.evaluator.sampling.max_new_tokens",), "with --accuracy: response limit",
                  d["max_new_tokens"], int, needs="--accuracy"),
        GraphFlag("--no-bucketing", (f"{S}.bucketed",), "random batches instead of length-bucketed ones",
                  const=False),
    )


SFT_FLAGS = sft_flags(source_defaults("rlhf_configs.sft", "sft_stage"))


def sft_parser() -> argparse.ArgumentParser:
    """The inputs, the knob flags (`SFT_FLAGS`), LoRA and the run options."""
    p = argparse.ArgumentParser(prog="rlhf sft", formatter_class=HelpFormatter,
                                usage="rlhf sft MODEL --data FILE [options] [set:PATH=VALUE ...] [fiddler:NAME ...]")
    inputs = p.add_argument_group("inputs (they decide which nodes the graph has)")
    inputs.add_argument("model", help="model folder or hub id to fine-tune")
    inputs.add_argument("--data", required=True,
                        help="training rows: .parquet / .jsonl / .json (prompt or messages rows)")
    inputs.add_argument("--val", default=None, help="held-out rows for val/sft_loss (and --accuracy)")
    inputs.add_argument("--response-key", default=None,
                        help="prompt rows: train on extra_info[KEY] (None: ground truth)")
    inputs.add_argument("--accuracy", action="store_true",
                        help="also greedy exact-match accuracy on --val prompt rows")
    add_graph_flags(p, SFT_FLAGS)
    add_lora_flags(p)
    add_output_flags(p, "sft")
    return p


def add_lora_flags(p: argparse.ArgumentParser) -> None:
    """--lora-rank R [--lora-alpha A]: `fiddler:lora(rank=R, alpha=A)` (`lora_fiddler`)."""
    alpha = source_defaults("rlhf.workers.lora", "LoRA")["alpha"]
    group = p.add_argument_group("LoRA (= fiddler:lora(rank=R, alpha=A))")
    group.add_argument("--lora-rank", type=int, default=None,
                       help="train a LoRA adapter of this rank instead of all weights; None: full fine-tuning")
    group.add_argument("--lora-alpha", type=float, default=None,
                       help=f"with --lora-rank: the adapter's output is scaled by alpha / rank; None: {alpha:g}")


def lora_fiddler(p: argparse.ArgumentParser, a: argparse.Namespace) -> list[str]:
    """The `fiddler:lora(...)` word --lora-rank and --lora-alpha stand for (none without --lora-rank)."""
    if a.lora_alpha is not None and a.lora_rank is None:
        p.error("--lora-alpha needs --lora-rank")
    if a.lora_rank is None:
        return []
    return [f"fiddler:lora(rank={a.lora_rank!r}" + (f", alpha={a.lora_alpha!r})" if a.lora_alpha is not None else ")")]


def add_output_flags(p: argparse.ArgumentParser, stage: str) -> None:
    """Where the run goes and how it shows: run options, not knobs of the stage."""
    group = p.add_argument_group("run options (not graph knobs)")
    group.add_argument("--out", default="outputs",
                       help=f"output folder: <out>/{stage}/<time>/{stage}/final is the model")
    group.add_argument("--local", action="store_true", help="run in this process (LocalRuntime), not on Ray")
    group.add_argument("--aim-repo", default=None, help="record the run in this Aim repo (None: no tracking)")
    group.add_argument("--quiet", action="store_true", help="no progress bar")


def sft_graph(argv: Sequence[str]):
    """The graph `rlhf sft ARGV` runs: `sft_experiment` of the inputs, then the knob flags as their `set:`
    overrides, then --lora-rank's fiddler, then the `set:`/`fiddler:` words of the command line, in order."""
    p = sft_parser()
    argv, overrides = split_overrides(argv)
    a = p.parse_args(argv)
    if a.accuracy and a.val is None:
        p.error("--accuracy needs --val FILE (prompt rows)")
    from rlhf_configs.sft import sft_experiment

    graph = sft_experiment(a.model, a.data, a.val, out=a.out, local=a.local, aim_repo=a.aim_repo,
                           progress=not a.quiet, response_key=a.response_key, accuracy=a.accuracy)
    return apply_graph_flags(p, graph, a, SFT_FLAGS, [*lora_fiddler(p, a), *overrides])


def sft_main(argv: Sequence[str]) -> int:
    """Build the graph (`sft_graph`), run it, print the results."""
    graph = sft_graph(argv)
    from rlhf.runtime.experiment import run_experiment
    from rlhf.runtime.preflight import PreflightError

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
