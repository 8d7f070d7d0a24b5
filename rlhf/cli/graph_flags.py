"""Command-line flags that are aliases of `set:` overrides on a shipped graph: one name per knob.

`rlhf sft`, `generate`, `eval` and `probe` build their graph from their inputs (the model, the data
files, the choices that decide which nodes exist), then apply each knob flag given as the `set:`
override it is an alias of, then the command line's own `set:PATH=VALUE` and `fiddler:NAME(...)`
words, in order. So `rlhf sft M --data D --lr 1e-5` and `rlhf sft M --data D
set:stages.sft.policy.worker.optimizer.lr=1e-05` build the same graph, `--help` shows each flag's
path, and any field of the graph can be set without a flag for it.

This module is argparse only: `--help` must not import fiddle, torch or the graphs.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["GraphFlag", "HelpFormatter", "add_graph_flags", "apply_graph_flags", "split_overrides", "training_flags"]

OVERRIDE_HELP = ("Each knob flag is the set: override shown under it. Any set:PATH=VALUE or fiddler:NAME(...) word on\n"
                 "the command line applies after the flags, in order (docs/configuring.md).")


@dataclass(frozen=True)
class GraphFlag:
    """One knob flag: the graph paths its value is set at (`set:PATH=VALUE` each), for `--help` and the graph."""

    flag: str  # "--lr"
    paths: tuple[str, ...]  # the paths the value is set at, in the `set:` syntax
    help: str
    default: Any = None  # the shipped graph's value, shown by --help
    type: Callable[[str], Any] | None = None
    choices: Sequence[str] | None = None
    const: Any = None  # not None: a switch that sets this value
    where_set: tuple[str, ...] = ()  # also these paths, where the shipped graph sets them (an optional node)
    needs: str = ""  # the input that makes the node the paths lead to ("--accuracy"), for the error without it

    @property
    def dest(self) -> str:
        return self.flag.removeprefix("--").replace("-", "_")

    def commands(self, value: Any, is_set: Callable[[str], bool]) -> list[str]:
        """The `set:` overrides this flag stands for, with `value`."""
        paths = [*self.paths, *(p for p in self.where_set if is_set(p))]
        return [f"set:{path}={value!r}" for path in paths]

    def help_text(self) -> str:
        value = repr(self.const) if self.const is not None else self.dest.upper()
        alias = " ".join(f"set:{p}={value}" for p in self.paths)
        also = "".join(f" (and set:{p}={value} where the graph has it)" for p in self.where_set)
        default = "" if self.const is not None else f" (default {self.default})"
        return f"{self.help}{default}\n= {alias}{also}".replace("%", "%%")


def training_flags(d: dict, stage: str, group: str, rows: str,
                   max_length: tuple[str, ...] = ()) -> tuple[GraphFlag, ...]:
    """The knobs every training stage has (`rlhf sft`, `dpo`, `rm`): steps, batch, micro-batch, the optimizer and
    schedule, the data's length limit, validation and checkpoints, workers, dtype. `d`: the stage builder's
    defaults (for --help); `stage`/`group`: the paths of the stage and its worker group; `rows`: what a
    micro-batch counts; `max_length`: more paths the length limit is set at (besides the training and held-out
    data's)."""
    worker = f"{group}.worker"
    return (
        GraphFlag("--steps", (f"{stage}.total_steps", f"{worker}.lr_scheduler.num_training_steps"), "optimizer steps",
                  d["steps"], int),
        GraphFlag("--batch-size", (f"{stage}.batch_size",), "examples (pairs) per step, all workers",
                  d["batch_size"], int),
        GraphFlag("--micro-batch-size", (f"{worker}.training.micro_batch_size",),
                  f"{rows} per forward/backward (gradient accumulation below --batch-size)",
                  d["micro_batch_size"], int),
        GraphFlag("--lr", (f"{worker}.optimizer.lr",), "peak learning rate (cosine schedule)", d["lr"], float),
        GraphFlag("--warmup-steps", (f"{worker}.lr_scheduler.num_warmup_steps",), "linear warmup steps",
                  d["warmup_steps"], int),
        GraphFlag("--max-length", (f"{stage}.data.max_length", *max_length), "longer examples are dropped",
                  d["max_length"], int, where_set=(f"{stage}.val_data.max_length",)),
        GraphFlag("--test-freq", (f"{stage}.test_freq",), "validate every k steps (and at the end)", d["test_freq"],
                  int),
        GraphFlag("--save-freq", (f"{stage}.save_freq",), "resumable checkpoint every k steps (0: none)",
                  d["save_freq"], int),
        GraphFlag("--workers", (f"{group}.num_workers",), "data-parallel workers (Ray)", d["workers"], int),
        GraphFlag("--gpus-per-worker", (f"{group}.gpus_per_worker",), "GPUs per worker",
                  d["gpus_per_worker"], float),
        GraphFlag("--compute-dtype", (f"{worker}.training.compute_dtype",),
                  "matmul dtype (autocast); the trained weights and optimizer state stay float32",
                  d["compute_dtype"], choices=["float32", "bfloat16"]),
    )


class HelpFormatter(argparse.RawTextHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Wide lines, and each knob's help on two: what it does, then the override it is."""

    def __init__(self, prog: str):
        super().__init__(prog, max_help_position=30, width=140)


def add_graph_flags(parser: argparse.ArgumentParser, flags: Sequence[GraphFlag]) -> None:
    """The knob flags in their own help group; a flag not given leaves the shipped graph's value."""
    group = parser.add_argument_group("graph knobs", OVERRIDE_HELP)
    for f in flags:
        if f.const is not None:
            group.add_argument(f.flag, action="store_const", const=f.const, default=argparse.SUPPRESS,
                               help=f.help_text())
        else:
            group.add_argument(f.flag, type=f.type, choices=f.choices, default=argparse.SUPPRESS,
                               metavar=f.dest.upper() if f.choices is None else None, help=f.help_text())


def split_overrides(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """(the arguments for argparse, the `set:` and `fiddler:` words in order)."""
    words = [a for a in argv if a.startswith(("set:", "fiddler:"))]
    return [a for a in argv if not a.startswith(("set:", "fiddler:"))], words


def apply_graph_flags(parser: argparse.ArgumentParser, graph: Any, args: argparse.Namespace,
                      flags: Sequence[GraphFlag], overrides: Sequence[str] = ()) -> Any:
    """`graph` with the knob flags given in `args` (as their `set:` overrides), then `overrides` (`set:` and
    `fiddler:` words; fiddlers are those of `rlhf_configs.common`); a bad path ends with one line."""
    import rlhf_configs.common as common
    from rlhf.config.overrides import OverrideError, apply_commands, is_set, named_functions

    given = vars(args)
    for f in flags:
        if f.dest in given:
            try:
                graph = apply_commands(graph, f.commands(given[f.dest], lambda p: is_set(graph, p)), {})[0]
            except OverrideError as err:
                parser.error(f"{f.flag}: {err}" + (f" ({f.flag} needs {f.needs})" if f.needs else ""))
    try:
        return apply_commands(graph, overrides, named_functions([common]))[0]
    except OverrideError as err:
        parser.error(str(err))
