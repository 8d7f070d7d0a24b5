"""The check runner: every check of an experiment graph before anything starts, collected into one report.

`check_experiment(graph, stages)` is the graph part alone (types and ranges, required arguments,
stage order, resources, data flow, batch arithmetic: no files read, cheap). `preflight_report`
adds what reads files: the run record of a named run, the components' own hooks, the rows'
data sources against the rewards, and the memory plan (model configs). `preflight` raises one
`PreflightError` listing every problem and logs the warnings.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Any

import fiddle as fdl
from fiddle import daglish

from rlhf.graph.typecheck import annotation_problems
from rlhf.runtime.plan import compile_graph
from rlhf.runtime.preflight.batches import BatchArithmetic, batch_problems, stage_batches
from rlhf.runtime.preflight.data_flow import data_flow_problems, reward_source_problems, stage_order_problems
from rlhf.runtime.preflight.graph import cli_path, graph_nodes, selected_stages
from rlhf.runtime.preflight.memory import MemoryPlan, memory_plan
from rlhf.runtime.preflight.resources import resource_problems
from rlhf.runtime.preflight_hooks import hook_problems
from rlhf.runtime.run_record import RunRecord, run_folder

__all__ = ["PreflightError", "Report", "batch_arithmetic", "check_experiment", "preflight", "preflight_report"]

log = logging.getLogger(__name__)


class PreflightError(ValueError):
    """One or more parts of the graph cannot run; the message lists each problem."""


@dataclasses.dataclass
class Report:
    errors: list[str] = dataclasses.field(default_factory=list)
    warnings: list[str] = dataclasses.field(default_factory=list)
    batches: list[BatchArithmetic] = dataclasses.field(default_factory=list)
    memory: list[MemoryPlan] = dataclasses.field(default_factory=list)  # per stage, by `preflight_report`
    complete: bool = True  # False: the checks stopped at missing or ill-typed values (listed in errors)


def preflight(
    graph: Any,
    stages: Sequence[str] | None = None,
    *,
    cpus: int | None = None,
    gpus: int | None = None,
    allow_changes: bool = False,
) -> Report:
    """Every check (see the package docstring) of the stages that will run (`stages`; None: all).

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
    or ill-typed values (`report.complete` False) the run record, the hooks and the memory plan are
    not consulted."""
    report = check_experiment(graph, stages, cpus=cpus, gpus=gpus)
    if report.complete:
        report.errors += _run_record_problems(graph, stages, allow_changes)
        report.errors += [p.removeprefix("- ") for p in hook_problems(graph)]
        for name, stage in selected_stages(graph, stages, []).items():
            report.errors += reward_source_problems(name, stage)
        if not report.errors:  # a plan of a graph that cannot run would only repeat its problems
            for name, stage in selected_stages(graph, stages, []).items():
                plan = memory_plan(graph, name, stage, gpus=gpus)
                report.memory.append(plan)
                report.errors += plan.problems
    return report


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
    selected = selected_stages(graph, stages, report.errors)
    report.errors += _required_problems(graph, selected)
    mistyped = annotation_problems((n, cli_path(p)) for n, p in graph_nodes(graph, selected))
    if mistyped:
        report.errors += mistyped
        report.complete = False  # the checks below do arithmetic on these values: they assume well-typed ones
        return report
    report.errors += stage_order_problems(graph, selected)
    for name, stage in selected.items():
        try:
            plan = compile_graph(stage)
        except (TypeError, ValueError) as err:
            report.errors.append(f"stage {name!r}: {err}")
        else:
            errors, warnings = resource_problems(graph, name, plan, cpus, gpus)
            report.errors += errors
            report.warnings += warnings
        errors, warnings = data_flow_problems(name, stage)
        report.errors += errors
        report.warnings += warnings
        for batch in stage_batches(graph, name, stage):
            report.batches.append(batch)
            errors, warnings = batch_problems(batch)
            report.errors += errors
            report.warnings += warnings
    return report


def batch_arithmetic(graph: Any, stages: Sequence[str] | None = None) -> list[BatchArithmetic]:
    """The batch arithmetic of every RL/SFT stage of an Experiment graph that will run."""
    return check_experiment(graph, stages).batches


def _required_problems(graph: Any, selected: dict[str, Any]) -> list[str]:
    """Arguments a `fdl.Config` needs that the graph does not set (a Partial's come from its caller)."""
    problems = []
    for node, path in graph_nodes(graph, selected):
        if not isinstance(node, fdl.Config):
            continue
        for name, param in node.__signature_info__.signature.parameters.items():
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD) or param.default is not param.empty:
                continue
            if node.__arguments__.get(name, fdl.NO_VALUE) is fdl.NO_VALUE:
                where = cli_path((*path, daglish.Attr(name)))
                problems.append(
                    f"{where}: {fdl.get_callable(node).__name__} needs `{name}`, which is not set. "
                    f"Set it in the experiment's graph, or on the command line: --config 'set:{where}=...'."
                )
    return problems
