"""Batch arithmetic: how one step's samples split over data-parallel workers, mini- and micro-batches.

`stage_batches` reads it from an RL, SFT, DPO or reward-model stage's graph, `batch_problems` says what does not
divide (an error: a padded row would train twice, or a mini-batch would weigh wrong; a warning
for micro-batches, which change memory use, not the update), and `batch_table` prints it.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Sequence
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from rlhf.runtime.preflight.graph import args, cli_path, get, is_a, nodes, runtime_kind, stage_prefix
from rlhf.runtime.remote import Remote
from rlhf.trainers.rl import RLTrainer
from rlhf.trainers.dpo import DPOTrainer
from rlhf.trainers.reward_model import RewardModelTrainer
from rlhf.trainers.sft import SFTTrainer

__all__ = ["BatchArithmetic", "batch_problems", "batch_table", "stage_batches"]


@dataclasses.dataclass(frozen=True)
class BatchArithmetic:
    """How one step's batch is split, for one RL or SFT stage."""

    stage: str
    prompts: int  # prompts per RL step (examples per SFT step)
    n: int  # samples per prompt (1 for SFT)
    workers: int  # data-parallel workers that run the update
    mini_batches: int  # optimizer steps per epoch
    micro_batch_size: int  # rows per forward/backward
    epochs: int
    path: str = ""  # the trainer, in set: syntax (stages.grpo)
    prompts_field: str = "prompts_per_step"  # its argument that sets `prompts` (batch_size for SFT)
    note: str = ""  # e.g. the runtime uses fewer workers than the graph asks for
    pairs: bool = False  # DPO: `prompts` counts preference pairs (n = 2 rows each), never split between workers
    group: str = "policy"  # the trained group's argument of the trainer (`rm` for a reward model)

    @property
    def samples(self) -> int:
        return self.prompts * self.n

    @property
    def rows_per_worker(self) -> float:
        return self.samples / self.workers

    @property
    def rows_per_mini_batch(self) -> float:
        return self.rows_per_worker / self.mini_batches

    @property
    def micro_batches(self) -> int:
        """Micro-batches per worker per mini-batch (gradient accumulation steps)."""
        return math.ceil(math.ceil(self.rows_per_mini_batch) / self.micro_batch_size)

    @property
    def optimizer_steps(self) -> int:
        return self.epochs * self.mini_batches


def batch_table(batches: Sequence[BatchArithmetic]) -> str:
    """One table, a row per stage: prompts, samples, workers, rows, mini- and micro-batches, steps."""
    table = Table(title="batch arithmetic per step", title_justify="left", box=box.SIMPLE_HEAD)
    for column in ("stage", "prompts", "x n", "samples", "DP workers", "rows/worker",
                   "mini-batches", "rows/mini-batch", "micro-batches", "optimizer steps"):
        table.add_column(column, justify="left" if column == "stage" else "right")
    for b in batches:
        table.add_row(
            b.stage, str(b.prompts), str(b.n), str(b.samples), f"{b.workers}{'*' if b.note else ''}",
            _num(b.rows_per_worker), str(b.mini_batches), _num(b.rows_per_mini_batch),
            f"{b.micro_batches} x {min(b.micro_batch_size, math.ceil(b.rows_per_mini_batch))}",
            f"{b.optimizer_steps}" + (f" ({b.epochs} epochs)" if b.epochs > 1 else ""),
        )
    notes = [f"* {b.stage}: {b.note}" for b in batches if b.note]
    console = Console(width=140, record=True, file=open(os.devnull, "w"))
    console.print(table)
    text = "\n".join(line.rstrip() for line in console.export_text().rstrip().splitlines())
    legend = ("micro-batches: per worker and mini-batch, x rows each (gradient accumulation); "
              "optimizer steps per step: epochs x mini-batches")
    return "\n".join([text, legend, *notes])


def _role(b: BatchArithmetic) -> str:
    return "reward-model" if b.group == "rm" else "policy"


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:.2f} (!)"


def stage_batches(graph: Any, name: str, stage: Any) -> list[BatchArithmetic]:
    """The batch arithmetic of every RL/SFT/DPO/reward-model trainer of a stage whose numbers are plain (else none)."""
    out = []
    kind, _ = runtime_kind(graph)
    for node, path in nodes(stage, stage_prefix(name)):
        if not (is_a(node, RLTrainer) or is_a(node, SFTTrainer) or is_a(node, RewardModelTrainer)):
            continue
        arguments = args(node)
        role = "rm" if is_a(node, RewardModelTrainer) else "policy"
        pairs = is_a(node, DPOTrainer) or role == "rm"  # batch_size counts preference pairs
        policy = arguments.get(role)
        if not is_a(policy, Remote):
            continue
        group, training = args(policy), get(get(policy, "worker"), "training")  # a TrainingSetup (node)
        if is_a(node, RLTrainer):
            field, prompts = "prompts_per_step", arguments.get("prompts_per_step")
            n = get(arguments.get("sampling"), "n")
        elif pairs:  # 2 rows each
            field, prompts, n = "batch_size", arguments.get("batch_size"), 2
        else:
            field, prompts, n = "batch_size", arguments.get("batch_size"), 1
        numbers = (prompts, n, group.get("num_workers"), get(training, "mini_batches"),
                   get(training, "micro_batch_size"), get(training, "epochs"))
        if not all(isinstance(x, int) and x > 0 for x in numbers):
            continue  # not plain numbers (unresolved or bad values): the components' own checks apply
        workers, note = numbers[2], ""
        if kind == "local" and workers > 1:
            workers = 1
            note = f"LocalRuntime runs the {group.get('name')!r} group with 1 worker instead of {numbers[2]}"
        label = name if len(path) <= 2 else f"{name} ({cli_path(path)})"
        out.append(BatchArithmetic(label, prompts, n, workers, numbers[3], numbers[4], numbers[5], cli_path(path),
                                   field, note, pairs=pairs, group=role))
    return out


def batch_problems(b: BatchArithmetic) -> tuple[list[str], list[str]]:
    """(errors, warnings) of one stage's batch arithmetic, each with the setting that fixes it."""
    errors: list[str] = []
    warnings: list[str] = []
    stage, path = b.stage, b.path
    what = (f"prompts_per_step x sampling.n = {b.prompts} x {b.n} = {b.samples} samples"
            if b.prompts_field == "prompts_per_step" else f"batch_size = {b.samples} examples")
    if b.pairs and b.prompts % b.workers:  # a pair's loss needs both rows on one rank
        fits = [w for w in range(1, b.workers + 1) if b.prompts % w == 0]
        errors.append(
            f"stage {stage!r}: batch_size = {b.prompts} preference pairs per step do not split evenly over "
            f"{b.workers} data-parallel {_role(b)} workers (each rank trains whole pairs). Make it a multiple of "
            f"{b.workers} (e.g. --config set:{path}.batch_size={_next_multiple(b.prompts, b.workers)}), or use "
            f"{fits[-1]} workers (--config 'fiddler:workers(n={fits[-1]})')."
        )
        return errors, warnings
    if b.samples % b.workers:
        fits = [w for w in range(1, b.workers + 1) if b.samples % w == 0]
        errors.append(
            f"stage {stage!r}: {what} per step do not split evenly over {b.workers} data-parallel {_role(b)} workers "
            f"(PolicyWorker.update is @shard_exact: a padded row would train twice). Make it a multiple of "
            f"{b.workers} (e.g. --config set:{path}.{b.prompts_field}="
            f"{_next_multiple(b.prompts, b.workers // math.gcd(b.workers, b.n))}), or use {fits[-1]} workers "
            f"(--config 'fiddler:workers(n={fits[-1]})')."
        )
        return errors, warnings
    rows = b.samples // b.workers
    if b.mini_batches > rows:
        errors.append(
            f"stage {stage!r}: each worker gets {rows} rows per step but the {_role(b)} worker wants {b.mini_batches} "
            f"mini-batches. Use at most {rows} (--config set:{path}.{b.group}.worker.training.mini_batches={rows})."
        )
    elif rows % b.mini_batches:
        divisors = [d for d in range(1, rows + 1) if rows % d == 0]
        close = min(divisors, key=lambda d: (abs(d - b.mini_batches), d))
        errors.append(
            f"stage {stage!r}: each worker's {rows} rows per step do not split into {b.mini_batches} equal "
            f"mini-batches (the last would be smaller and weigh as much in its optimizer step). Use a divisor of "
            f"{rows}, e.g. --config set:{path}.{b.group}.worker.training.mini_batches={close}, or change the samples per step."
        )
    else:
        mini = rows // b.mini_batches
        if mini % b.micro_batch_size and b.micro_batch_size < mini:
            warnings.append(
                f"stage {stage!r}: micro_batch_size={b.micro_batch_size} does not divide the {mini} rows of a "
                f"mini-batch: the last micro-batch has {mini % b.micro_batch_size} rows (same update, uneven memory "
                f"use). A divisor of {mini} avoids it (set:{path}.{b.group}.worker.training.micro_batch_size=...)."
            )
    return errors, warnings


def _next_multiple(x: int, k: int) -> int:
    return max(k, math.ceil(x / k) * k)
