"""The preflight: every check of an experiment graph before anything starts; each message says what to change.

One mechanism, one entry point: `preflight(graph, stages)` raises one `PreflightError` listing
every problem (and logs the warnings), or returns the `Report`. The experiment runner
(`rlhf.runtime.experiment.run_experiment`) calls it before any stage starts, so every way of
running a graph is checked; callers may run it earlier to stop sooner (`--print_plan`, a sweep
checking all its members before the first runs). `preflight_report` gives the same problems
without raising (a sweep labels them by member).

What it checks, in the stages that will run:

- every configured value against its parameter's annotation and range markers
  (`rlhf.graph.typecheck`; `Annotated[int, Positive]` from `rlhf.ranges`); the other checks
  run only on a well-typed graph;
- required arguments that are not set (a `fdl.Config` whose callable needs an argument the
  graph does not give; a `fdl.Partial` may leave arguments to its caller);
- resources the machine cannot give: GPUs asked for where there are none, more CPUs than a
  local Ray cluster has;
- data-flow contradictions: an advantage estimator that needs a critic in a trainer without
  one, a KL loss with no reference model, a group estimator (GRPO, RLOO, ...) with one sample
  per prompt, a stage using the output of a stage that does not run before it;
- batch arithmetic that does not divide: samples per step over the data-parallel workers
  (`PolicyWorker.update` is `@shard_exact`: a padded row would train twice), each worker's
  rows over its mini-batches. Micro-batches that do not divide are only a warning (they change
  memory use, not the update);
- for a named run that exists, the graph against the one it was started with
  (`rlhf.runtime.run_record`);
- the components' own `preflight` hooks (`rlhf.runtime.preflight_hooks`: missing model folder
  or data file, bad rows);
- every `data_source` of an RL stage's training rows and of an evaluator's rows against the
  reward's scorers (the trainer checks the same when it is built, but that is after the models
  load). Rows that come from an earlier stage or a stream are left to the trainer.

`check_experiment(graph, stages)` is the graph part alone (no hooks, no run record: cheap and
without reading files); `batch_table(batches)` is the batch arithmetic per RL/SFT stage,
printed at start-up.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from collections.abc import Sequence
from typing import Any

import datasets
import fiddle as fdl
import torch
from fiddle import daglish
from rich import box
from rich.console import Console
from rich.table import Table

from rlhf.algos.requirements import reference_problems, setup_problems
from rlhf.data.arrow import data_sources, is_validated
from rlhf.graph.typecheck import annotation_problems
from rlhf.runtime.local import LocalRuntime
from rlhf.runtime.plan import compile_graph
from rlhf.runtime.preflight_hooks import hook_problems
from rlhf.runtime.ray_runtime import RayRuntime
from rlhf.runtime.remote import Remote, StageOutput
from rlhf.runtime.run_record import RunRecord, run_folder
from rlhf.trainers.evaluate import Evaluator
from rlhf.trainers.rl import RLTrainer
from rlhf.trainers.sft import SFTTrainer
from rlhf.workers.policy import PolicyWorker

__all__ = [
    "BatchArithmetic",
    "PreflightError",
    "Report",
    "batch_arithmetic",
    "batch_table",
    "check_experiment",
    "gpu_count",
    "preflight",
    "preflight_report",
    "runtime_kind",
]

log = logging.getLogger(__name__)


class PreflightError(ValueError):
    """One or more parts of the graph cannot run; the message lists each problem."""


@dataclasses.dataclass(frozen=True)
class BatchArithmetic:
    """How one step's batch is split, for one RL or SFT stage."""

    stage: str
    prompts: int  # prompts per RL step (examples per SFT step)
    n: int  # samples per prompt (1 for SFT)
    workers: int  # data-parallel policy workers that run the update
    mini_batches: int  # optimizer steps per epoch
    micro_batch_size: int  # rows per forward/backward
    epochs: int
    path: str = ""  # the trainer, in set: syntax (stages.grpo)
    prompts_field: str = "prompts_per_step"  # its argument that sets `prompts` (batch_size for SFT)
    note: str = ""  # e.g. the runtime uses fewer workers than the graph asks for

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


@dataclasses.dataclass
class Report:
    errors: list[str] = dataclasses.field(default_factory=list)
    warnings: list[str] = dataclasses.field(default_factory=list)
    batches: list[BatchArithmetic] = dataclasses.field(default_factory=list)
    complete: bool = True  # False: the checks stopped at missing or ill-typed values (listed in errors)


def preflight(
    graph: Any,
    stages: Sequence[str] | None = None,
    *,
    cpus: int | None = None,
    gpus: int | None = None,
    allow_changes: bool = False,
) -> Report:
    """Every check (see the module docstring) of the stages that will run (`stages`; None: all).

    Raises one `PreflightError` listing all problems, logs the warnings, and returns the report.
    `cpus`/`gpus` are what this machine has (default: `os.cpu_count()`, CUDA devices);
    `allow_changes` accepts changes to a named run other than its model or algorithm.
    """
    report = preflight_report(graph, stages, cpus=cpus, gpus=gpus, allow_changes=allow_changes)
    if report.errors:
        raise PreflightError("the experiment cannot start:\n" + "\n".join(f"- {e}" for e in report.errors))
    for warning in report.warnings:
        log.warning("warning: %s", warning)
    return report


def preflight_report(
    graph: Any,
    stages: Sequence[str] | None = None,
    *,
    cpus: int | None = None,
    gpus: int | None = None,
    allow_changes: bool = False,
) -> Report:
    """The problems `preflight` raises, as `report.errors`, without raising. On a graph with missing
    or ill-typed values (`report.complete` False) the run record and the hooks are not consulted."""
    report = check_experiment(graph, stages, cpus=cpus, gpus=gpus)
    if report.complete:
        report.errors += _run_record_problems(graph, stages, allow_changes)
        report.errors += [p.removeprefix("- ") for p in hook_problems(graph)]
        for name, stage in _selected_stages(graph, stages, Report()).items():
            report.errors += _reward_source_problems(name, stage)
    return report


def _reward_source_problems(name: str, stage: Any) -> list[str]:
    """A `data_source` in the rows an RLTrainer trains on (or an Evaluator scores) that its reward has no
    scorer for. Reads the rows' loader (cached by its own hook) and builds the reward, both cheap."""
    problems = []
    for node, path in _nodes(stage, _stage_prefix(name)):
        pairs = {RLTrainer: ("train_data", "reward"), Evaluator: ("dataset", "reward")}
        for cls, (data_arg, reward_arg) in pairs.items():
            if not _is(node, cls):
                continue
            args = _args(node)
            sources = _row_sources(args.get(data_arg))
            reward = _built_or_none(args.get(reward_arg))
            if sources is None or not callable(getattr(reward, "check_sources", None)):
                continue
            try:
                reward.check_sources(sources)
            except ValueError as err:
                where = _cli_path((*path, daglish.Attr(data_arg)))
                problems.append(f"{where}: {err}")
    return problems


def _row_sources(dataset: Any) -> set[str] | None:
    """The data_source values of a dataset node's `rows`, or None when they cannot be read now."""
    if not isinstance(dataset, fdl.Buildable) or "rows" not in dataset.__arguments__:
        return None
    rows = _built_or_none(dataset.rows)
    if is_validated(rows):
        return data_sources(rows)
    if isinstance(rows, datasets.Dataset):
        return set(rows.unique("data_source")) - {None} if "data_source" in rows.column_names else None
    if isinstance(rows, (list, tuple)) and all(isinstance(r, dict) for r in rows):
        return {r["data_source"] for r in rows if isinstance(r.get("data_source"), str)}
    return None  # a stream (scanned when the trainer is built), or rows not readable now


def _built_or_none(value: Any) -> Any:
    """`value` built (a loader, a generator, a reward); None where it does not build now (a stage's output,
    a missing file: their own checks report those)."""
    if not isinstance(value, fdl.Buildable):
        return value
    try:
        return fdl.build(value)
    except Exception:  # noqa: BLE001 - reported elsewhere, or resolved later (StageOutput)
        return None


def _run_record_problems(graph: Any, stages: Sequence[str] | None, allow_changes: bool) -> list[str]:
    folder = run_folder(graph) if isinstance(graph, fdl.Buildable) and hasattr(graph, "stages") else None
    if folder is None:
        return []
    names = [s for s in dict(graph.stages) if stages is None or s in stages]
    try:
        return RunRecord(folder).problems(graph, names, allow_changes)
    except ValueError as err:
        return [str(err)]


def check_experiment(
    graph: Any, stages: Sequence[str] | None = None, *, cpus: int | None = None, gpus: int | None = None
) -> Report:
    """Check the stages of an `Experiment` graph that will run (`stages`; None: all).

    `cpus`/`gpus` are what this machine has (default: `os.cpu_count()`, CUDA devices).
    """
    report = Report()
    selected = _selected_stages(graph, stages, report)
    _check_required(graph, selected, report)
    mistyped = annotation_problems((n, _cli_path(p)) for n, p in _graph_nodes(graph, selected))
    if mistyped:
        report.errors += mistyped
        report.complete = False  # the checks below do arithmetic on these values: they assume well-typed ones
        return report
    _check_stage_order(graph, selected, report)
    for name, stage in selected.items():
        _check_resources(graph, name, stage, report, cpus, gpus)
        _check_data_flow(name, stage, report)
        for batch in _batches(graph, name, stage):
            report.batches.append(batch)
            _check_batch(batch, report)
    return report


def batch_arithmetic(graph: Any, stages: Sequence[str] | None = None) -> list[BatchArithmetic]:
    """The batch arithmetic of every RL/SFT stage of an Experiment graph that will run."""
    return check_experiment(graph, stages).batches


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


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:.2f} (!)"


# --------------------------------------------------------------------------- helpers
def _is(node: Any, cls: type) -> bool:
    if not isinstance(node, fdl.Buildable):
        return False
    fn = fdl.get_callable(node)
    return isinstance(fn, type) and issubclass(fn, cls)


def _args(node: fdl.Buildable) -> dict[str, Any]:
    return fdl.ordered_arguments(node, include_defaults=True)


def _get(value: Any, name: str) -> Any:
    """An argument of a node (with its default), or an attribute of a built default object."""
    if isinstance(value, fdl.Buildable):
        return _args(value).get(name)
    return getattr(value, name, None)


def _cli_path(path: daglish.Path) -> str:
    """A daglish path in `set:` syntax: `stages.grpo.policy.worker.model_path`."""
    out = ""
    for element in path:
        if isinstance(element, daglish.Attr):
            out += f".{element.name}"
        elif isinstance(element, daglish.Key) and isinstance(element.key, str) and element.key.isidentifier():
            out += f".{element.key}"
        elif isinstance(element, daglish.Key):
            out += f"[{element.key!r}]"
        elif isinstance(element, daglish.Index):
            out += f"[{element.index}]"
        else:
            out += element.code
    return out.lstrip(".")


def _nodes(root: Any, prefix: daglish.Path = ()) -> list[tuple[fdl.Buildable, daglish.Path]]:
    """Every Buildable under `root` once (its first path), with its path from the experiment root."""
    seen: set[int] = set()
    out = []
    for value, path in daglish.iterate(root):
        if isinstance(value, fdl.Buildable) and id(value) not in seen:
            seen.add(id(value))
            out.append((value, (*prefix, *path)))
    return out


def _stage_prefix(name: str) -> daglish.Path:
    return (daglish.Attr("stages"), daglish.Key(name))


def _selected_stages(graph: Any, stages: Sequence[str] | None, report: Report) -> dict[str, Any]:
    all_stages = dict(_get(graph, "stages") or {})
    if stages is None:
        return all_stages
    unknown = [s for s in stages if s not in all_stages]
    if unknown:
        report.errors.append(
            f"--stages names {', '.join(map(repr, unknown))}, which the experiment does not have. "
            f"Its stages are: {', '.join(all_stages)}."
        )
    return {k: v for k, v in all_stages.items() if k in stages}


def runtime_kind(graph: Any) -> tuple[str, dict[str, Any]]:
    """("local" | "ray" | "other", the runtime's arguments) of an Experiment graph."""
    runtime = _get(graph, "runtime")
    if runtime is None or _is(runtime, LocalRuntime):
        return "local", {}
    if _is(runtime, RayRuntime):
        return "ray", _args(runtime)
    return "other", {}


# --------------------------------------------------------------------------- checks
def _check_required(graph: Any, selected: dict[str, Any], report: Report) -> None:
    for node, path in _graph_nodes(graph, selected):
        if not isinstance(node, fdl.Config):
            continue  # a Partial's missing arguments come from its caller
        for name, param in node.__signature_info__.signature.parameters.items():
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD) or param.default is not param.empty:
                continue
            if node.__arguments__.get(name, fdl.NO_VALUE) is fdl.NO_VALUE:
                where = _cli_path((*path, daglish.Attr(name)))
                report.errors.append(
                    f"{where}: {fdl.get_callable(node).__name__} needs `{name}`, which is not set. "
                    f"Set it in the experiment's graph, or on the command line: --config 'set:{where}=...'."
                )


def _graph_nodes(graph: Any, selected: dict[str, Any]) -> list[tuple[fdl.Buildable, daglish.Path]]:
    """The root, every node of the stages that will run, and of the root's other arguments (runtime, ...)."""
    nodes = [(graph, ())] if isinstance(graph, fdl.Buildable) else []  # the root itself, not all below it
    for name, stage in selected.items():
        nodes += _nodes(stage, _stage_prefix(name))
    if isinstance(graph, fdl.Buildable):
        for key, value in graph.__arguments__.items():
            if key != "stages":
                nodes += _nodes(value, (daglish.Attr(key),))
    return nodes


def _check_stage_order(graph: Any, selected: dict[str, Any], report: Report) -> None:
    order = list(dict(_get(graph, "stages") or {}))
    for name, stage in selected.items():
        for node, path in _nodes(stage, _stage_prefix(name)):
            if not _is(node, StageOutput):
                continue
            ref = fdl.build(node)
            where = _cli_path(path)
            if ref.stage not in order or order.index(ref.stage) >= order.index(name):
                report.errors.append(
                    f"{where}: stage {name!r} uses the output {ref.key!r} of stage {ref.stage!r}, which has not "
                    f"run before it (stages run in order: {', '.join(order)}). Reorder the stages."
                )
            elif ref.stage not in selected:
                report.errors.append(
                    f"{where}: stage {name!r} uses the output {ref.key!r} of stage {ref.stage!r}, which is not "
                    f"among the stages to run. Run both (--stages {ref.stage},{name}), or give the value "
                    f"itself: --config 'set:{where}=\"...\"'."
                )


def _check_resources(graph: Any, name: str, stage: Any, report: Report, cpus: int | None, gpus: int | None) -> None:
    try:
        plan = compile_graph(stage)
    except (TypeError, ValueError) as err:
        report.errors.append(f"stage {name!r}: {err}")
        return
    kind, ray_args = runtime_kind(graph)
    owners = [g for g in plan.groups.values() if not g.colocate_with]
    groups = ", ".join(f"{g.name}: {g.num_workers} x ({g.cpus_per_worker:g} CPU, {g.gpus_per_worker:g} GPU)"
                       for g in plan.groups.values())
    machine_gpus = gpu_count() if gpus is None else gpus
    machine_cpus = (os.cpu_count() or 1) if cpus is None else cpus
    on_cpu_fix = (f"On a CPU machine set gpus_per_worker=0: --config 'fiddler:gin(path=\"cpu.gin\")' "
                  f"(or set:{_cli_path(_stage_prefix(name))}.<group>.gpus_per_worker=0).")
    if kind == "local":
        if any(g.gpus_per_worker > 0 for g in plan.groups.values()) and machine_gpus == 0:
            report.errors.append(f"stage {name!r} asks for GPUs ({groups}) but this machine has none. {on_cpu_fix}")
        return
    if kind != "ray" or ray_args.get("address") is not None:
        return  # an existing cluster's resources are known only to the cluster
    need_cpus = sum(g.cpus_per_worker * g.num_workers for g in owners)
    need_gpus = sum(g.gpus_per_worker * g.num_workers for g in owners)
    have_gpus = ray_args.get("num_gpus") if ray_args.get("num_gpus") is not None else machine_gpus
    if need_gpus > have_gpus:
        where = "this machine has none" if have_gpus == 0 else f"the local Ray cluster has {have_gpus:g}"
        report.errors.append(
            f"stage {name!r} needs {need_gpus:g} GPUs ({groups}) but {where}. "
            + (on_cpu_fix if have_gpus == 0 else "Lower num_workers or gpus_per_worker of its groups.")
        )
    num_cpus = ray_args.get("num_cpus")
    if num_cpus is None and need_cpus > machine_cpus:
        report.errors.append(
            f"stage {name!r} needs {need_cpus:g} CPUs ({groups}) but this machine has {machine_cpus}, and the "
            f"local Ray cluster would oversubscribe them. Use fewer workers (--config 'fiddler:workers(n="
            f"{max(1, machine_cpus)})') or CPUs per worker, run in-process (--config fiddler:local), or "
            f"oversubscribe on purpose with set:runtime.num_cpus={math.ceil(need_cpus)}."
        )
    elif num_cpus is not None and need_cpus > num_cpus:
        report.errors.append(
            f"stage {name!r} needs {need_cpus:g} CPUs ({groups}) but RayRuntime.num_cpus={num_cpus}: Ray would "
            f"wait forever for the placement. Raise set:runtime.num_cpus={math.ceil(need_cpus)} or use fewer workers."
        )
    elif num_cpus is not None and num_cpus > machine_cpus and need_cpus > machine_cpus:
        report.warnings.append(
            f"stage {name!r} runs {need_cpus:g} CPUs of workers on a machine with {machine_cpus} (RayRuntime.num_cpus="
            f"{num_cpus}): oversubscribed, each worker will be slower."
        )


def gpu_count() -> int:
    """CUDA devices this process sees."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _callable_of(value: Any) -> Any:
    return fdl.get_callable(value) if isinstance(value, fdl.Buildable) else type(value)


def _check_data_flow(name: str, stage: Any, report: Report) -> None:
    """The estimator/critic/sample-count/reference rules of `rlhf.algos.requirements` (the trainer reads
    the same rules), reported with the graph path to change."""
    for node, path in _nodes(stage, _stage_prefix(name)):
        where = _cli_path(path)
        problems = []
        if _is(node, RLTrainer):
            args = _args(node)
            estimator = args.get("advantage")
            n = _get(args.get("sampling"), "n")
            problems = setup_problems(
                _callable_of(estimator), n=n if isinstance(n, int) else None,
                has_critic=args.get("critic") is not None, dynamic_sampling=args.get("dynamic_sampling") is not None,
            ) if estimator is not None else []
            policy = args.get("policy")
            if args.get("kl_in_reward") is not None and _is(policy, Remote) and _is(_get(policy, "worker"), PolicyWorker):
                has_ref = _get(_get(policy, "worker"), "ref_model_path") is not None
                problems += reference_problems(kl_loss=False, kl_in_reward=True, has_ref=has_ref)
        if _is(node, PolicyWorker):
            args = _args(node)
            objective = args.get("objective")
            kl = _get(objective, "kl_loss") if objective is not None else None
            problems = [  # paths below the worker, not below the trainer
                dataclasses.replace(p, field=p.field.removeprefix("policy.worker."),
                                    fix=p.fix.removeprefix("policy.worker."))
                for p in reference_problems(kl_loss=kl is not None, kl_in_reward=False,
                                            has_ref=args.get("ref_model_path") is not None)
            ]
        for problem in problems:
            fix = f" Fix: --config 'set:{where}.{problem.fix}'." if problem.fix else ""
            report.errors.append(f"{where}.{problem.field}: {problem.message}{fix}")


def _batches(graph: Any, name: str, stage: Any) -> list[BatchArithmetic]:
    out = []
    kind, _ = runtime_kind(graph)
    for node, path in _nodes(stage, _stage_prefix(name)):
        if not (_is(node, RLTrainer) or _is(node, SFTTrainer)):
            continue
        args = _args(node)
        policy = args.get("policy")
        if not _is(policy, Remote):
            continue
        group, training = _args(policy), _get(_get(policy, "worker"), "training")  # a TrainingSetup (node)
        if _is(node, RLTrainer):
            field, prompts, n = "prompts_per_step", args.get("prompts_per_step"), _get(args.get("sampling"), "n")
        else:
            field, prompts, n = "batch_size", args.get("batch_size"), 1
        numbers = (prompts, n, group.get("num_workers"), _get(training, "mini_batches"),
                   _get(training, "micro_batch_size"), _get(training, "epochs"))
        if not all(isinstance(x, int) and x > 0 for x in numbers):
            continue  # not plain numbers (unresolved or bad values): the components' own checks apply
        workers, note = numbers[2], ""
        if kind == "local" and workers > 1:
            workers = 1
            note = f"LocalRuntime runs the {group.get('name')!r} group with 1 worker instead of {numbers[2]}"
        label = name if len(path) <= 2 else f"{name} ({_cli_path(path)})"
        out.append(BatchArithmetic(label, prompts, n, workers, numbers[3], numbers[4], numbers[5], _cli_path(path),
                                   field, note))
    return out


def _check_batch(b: BatchArithmetic, report: Report) -> None:
    stage, path = b.stage, b.path
    what = (f"prompts_per_step x sampling.n = {b.prompts} x {b.n} = {b.samples} samples"
            if b.prompts_field == "prompts_per_step" else f"batch_size = {b.samples} examples")
    if b.samples % b.workers:
        fits = [w for w in range(1, b.workers + 1) if b.samples % w == 0]
        report.errors.append(
            f"stage {stage!r}: {what} per step do not split evenly over {b.workers} data-parallel policy workers "
            f"(PolicyWorker.update is @shard_exact: a padded row would train twice). Make it a multiple of "
            f"{b.workers} (e.g. --config set:{path}.{b.prompts_field}="
            f"{_next_multiple(b.prompts, b.workers // math.gcd(b.workers, b.n))}), or use {fits[-1]} workers "
            f"(--config 'fiddler:workers(n={fits[-1]})')."
        )
        return
    rows = b.samples // b.workers
    if b.mini_batches > rows:
        report.errors.append(
            f"stage {stage!r}: each worker gets {rows} rows per step but the policy worker wants {b.mini_batches} "
            f"mini-batches. Use at most {rows} (--config set:{path}.policy.worker.training.mini_batches={rows})."
        )
    elif rows % b.mini_batches:
        divisors = [d for d in range(1, rows + 1) if rows % d == 0]
        close = min(divisors, key=lambda d: (abs(d - b.mini_batches), d))
        report.errors.append(
            f"stage {stage!r}: each worker's {rows} rows per step do not split into {b.mini_batches} equal "
            f"mini-batches (the last would be smaller and weigh as much in its optimizer step). Use a divisor of "
            f"{rows}, e.g. --config set:{path}.policy.worker.training.mini_batches={close}, or change the samples per step."
        )
    else:
        mini = rows // b.mini_batches
        if mini % b.micro_batch_size and b.micro_batch_size < mini:
            report.warnings.append(
                f"stage {stage!r}: micro_batch_size={b.micro_batch_size} does not divide the {mini} rows of a "
                f"mini-batch: the last micro-batch has {mini % b.micro_batch_size} rows (same update, uneven memory "
                f"use). A divisor of {mini} avoids it (set:{path}.policy.worker.training.micro_batch_size=...)."
            )


def _next_multiple(x: int, k: int) -> int:
    return max(k, math.ceil(x / k) * k)
