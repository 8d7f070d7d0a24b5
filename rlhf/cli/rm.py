"""`rlhf rm MODEL --data PAIRS ...`: `rlhf_configs.reward_model.rm_experiment`'s graph, its knob flags, the run.

    rlhf rm MODEL --data pairs.jsonl [--val heldout.jsonl] [--steps 500 --batch-size 32 --lr 1e-5]
                  [--lora-rank 16 --lora-alpha 32] [set:PATH=VALUE ...] [--out outputs]

The graph is built from the inputs (MODEL, --data, --val); every knob flag is an alias of the `set:` override
`--help` shows beside it (`RM_FLAGS`, as for `rlhf sft`), and any other `set:` or `fiddler:` word may follow. The
defaults shown are `rm_stage`'s, read from its source (`source_defaults`): the graph, torch and the runtimes are
imported only once the flags are parsed, so `--help` answers at once.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from rlhf.argtypes import number
from rlhf.cli.graph_flags import (GraphFlag, HelpFormatter, add_graph_flags, apply_graph_flags, split_overrides,
                                  training_flags)
from rlhf.cli.sft import add_lora_flags, add_output_flags, lora_fiddler
from rlhf.cli.source_defaults import source_defaults

__all__ = ["RM_FLAGS", "rm_graph", "rm_main", "rm_parser"]

S = "stages.rm"
WORKER = f"{S}.rm.worker"


def rm_flags(d: dict) -> tuple[GraphFlag, ...]:
    """The knob flags of `rlhf rm` and their paths; `d`: `rm_stage`'s defaults, for --help."""
    return (
        *training_flags(d, S, f"{S}.rm", "rows (2 per pair; a pair's rows always share one)",
                        max_length=(f"{WORKER}.max_length",)),
        GraphFlag("--max-tokens-per-micro-batch", (f"{WORKER}.training.max_tokens_per_micro_batch",),
                  "cut micro-batches by this token budget instead (rows grouped by length)",
                  d["max_tokens_per_micro_batch"], int),
        GraphFlag("--center-rewards-coefficient", (f"{WORKER}.loss.center_rewards_coefficient",),
                  "weight of the reward-centring term (TRL's; 0.01 is its documented value); None: off",
                  d["center_rewards_coefficient"], number(float, 0)),
        GraphFlag("--seed", (f"{S}.seed", f"{WORKER}.training.seed"), "the new score head's draw and the data order",
                  d["seed"], int),
    )


RM_FLAGS = rm_flags(source_defaults("rlhf_configs.reward_model", "rm_stage"))


def rm_parser() -> argparse.ArgumentParser:
    """The inputs, the knob flags (`RM_FLAGS`), LoRA and the run options."""
    p = argparse.ArgumentParser(prog="rlhf rm", formatter_class=HelpFormatter,
                                usage="rlhf rm MODEL --data FILE [options] [set:PATH=VALUE ...] [fiddler:NAME ...]",
                                description="Train a reward model (a one-label score head on MODEL) on preference "
                                            "pairs with the Bradley-Terry loss (docs/preferences.md).")
    inputs = p.add_argument_group("inputs (they decide which nodes the graph has)")
    inputs.add_argument("model", help="model folder or hub id to start from (a causal LM: the policy or an SFT "
                                      "checkpoint)")
    inputs.add_argument("--data", required=True, help="preference pairs: .parquet / .jsonl / .json or a datasets "
                                                      "folder (prompt, chosen, rejected)")
    inputs.add_argument("--val", default=None, help="held-out pairs for rm/accuracy, rm/margin, rm/chosen_mean, ...")
    add_graph_flags(p, RM_FLAGS)
    add_lora_flags(p)  # the score head trains beside the adapter
    add_output_flags(p, "rm")
    return p


def rm_graph(argv: Sequence[str]):
    """The graph `rlhf rm ARGV` runs: `rm_experiment` of the inputs, then the knob flags as their `set:`
    overrides, then --lora-rank's fiddler, then the command line's `set:`/`fiddler:` words, in order."""
    p = rm_parser()
    argv, overrides = split_overrides(argv)
    a = p.parse_args(argv)
    from rlhf_configs.reward_model import rm_experiment

    graph = rm_experiment(a.model, a.data, a.val, out=a.out, local=a.local, aim_repo=a.aim_repo,
                          progress=not a.quiet)
    return apply_graph_flags(p, graph, a, RM_FLAGS, [*lora_fiddler(p, a), *overrides])


def rm_main(argv: Sequence[str]) -> int:
    """Build the graph (`rm_graph`), run it, print the folder, the reward statistics and held-out metrics."""
    graph = rm_graph(argv)
    from rlhf.runtime.experiment import run_experiment
    from rlhf.runtime.preflight import PreflightError

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
