"""Run an experiment graph: its stages in order, each compiled to a Plan and run on the runtime.

The root of every experiment graph is `fdl.Config(Experiment, ...)`. For each stage the
runner resolves `StageOutput` references (the RL stage starts from the SFT checkpoint),
compiles the stage graph, opens the stage's tracking run with its lineage (parent = the run
whose output it consumed), starts the worker groups, builds the driver side, runs it, and
always stops the groups and closes the run, also on Ctrl-C.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import fiddle as fdl
from fiddle import daglish

from rlhf.config.graph_io import graph_hash
from rlhf.runtime.plan import bind_groups, compile_graph
from rlhf.runtime.remote import StageOutput
from rlhf.trainers.context import StageContext


@dataclasses.dataclass
class Experiment:
    """The root of an experiment graph (the runner reads it; it is never built as a whole)."""

    name: str  # experiment name: Aim experiment, output folder
    stages: dict[str, Any]  # stage name -> stage graph (a trainer with `.run(ctx)`), run in order
    runtime: Any = None  # RayRuntime / LocalRuntime config; None: LocalRuntime
    tracker: Any = None  # AimTracker config; None: no tracking
    output_dir: str = "outputs"  # checkpoints go to <output_dir>/<name>/<timestamp>/<stage>
    progress: bool = True  # progress bars on the console


class _NoRun:
    """Stands in for a tracking run when the experiment has no tracker."""

    hash = None

    def track(self, metrics: Mapping[str, float], step: int) -> None:
        pass

    def set_params(self, params: Mapping[str, Any]) -> None:
        pass

    def __enter__(self) -> _NoRun:
        return self

    def __exit__(self, *exc: Any) -> bool:
        return False


def stage_references(graph: Any) -> list[StageOutput]:
    """The `StageOutput` nodes of a graph, in traversal order."""
    refs: list[StageOutput] = []

    def visit(value: Any, state: daglish.State) -> Any:
        if isinstance(value, fdl.Buildable) and fdl.get_callable(value) is StageOutput:
            refs.append(fdl.build(value))
            return value
        return state.map_children(value)

    daglish.MemoizedTraversal.run(visit, graph)
    return refs


def resolve_stage_outputs(graph: Any, results: Mapping[str, Mapping[str, Any]], stage: str) -> Any:
    """`graph` with every `StageOutput` replaced by the value an earlier stage returned."""

    def swap(value: Any, state: daglish.State) -> Any:
        if isinstance(value, fdl.Buildable) and fdl.get_callable(value) is StageOutput:
            ref = fdl.build(value)
            if ref.stage not in results:
                raise ValueError(
                    f"stage {stage!r} uses the output {ref.key!r} of stage {ref.stage!r}, which has not run "
                    f"before it (stages run in order: {list(results)} so far). Reorder the stages."
                )
            if ref.key not in results[ref.stage]:
                raise ValueError(
                    f"stage {stage!r} uses output {ref.key!r} of stage {ref.stage!r}, which returned only "
                    f"{sorted(results[ref.stage])}"
                )
            return results[ref.stage][ref.key]
        return state.map_children(value)

    return daglish.MemoizedTraversal.run(swap, graph)


def run_experiment(
    graph: fdl.Config,
    overrides: Sequence[str] = (),
    fiddlers: Sequence[str] = (),
    stages: Sequence[str] | None = None,
) -> dict[str, dict[str, Any]]:
    """Run the stages of an Experiment graph in order; returns each stage's result (+ run hash)."""
    from rlhf.config.validate import preflight
    from rlhf.runtime.local import LocalRuntime

    if fdl.get_callable(graph) is not Experiment:
        raise TypeError(f"the root of an experiment graph must be fdl.Config(Experiment, ...), got {graph!r}")
    preflight(graph)
    runtime = fdl.build(graph.runtime) if graph.runtime is not None else LocalRuntime()
    tracker = fdl.build(graph.tracker) if graph.tracker is not None else None
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out_root = Path(graph.output_dir) / graph.name / stamp
    experiment_hash = graph_hash(graph)
    results: dict[str, dict[str, Any]] = {}
    try:
        for stage_name, stage_graph in graph.stages.items():
            if stages is not None and stage_name not in stages:
                continue
            refs = stage_references(stage_graph)
            parent = next((results[r.stage].get("run_hash") for r in refs if r.stage in results), None)
            resolved = resolve_stage_outputs(stage_graph, results, stage_name)
            plan = compile_graph(resolved)
            run = _start_run(tracker, stage_name, resolved, plan, overrides, fiddlers, parent, experiment_hash)
            with run:
                groups = runtime.start_groups(plan)
                try:
                    stage = fdl.build(bind_groups(plan.driver, groups))
                    ctx = StageContext(
                        out_dir=out_root / stage_name,
                        log=run.track,
                        record=run.set_params,
                        name=stage_name,
                        progress=graph.progress,
                    )
                    result = dict(stage.run(ctx))
                finally:
                    runtime.stop_groups()
                result["run_hash"] = run.hash
                result["parent_run"] = parent
                if "checkpoint" in result:
                    run.set_params({"checkpoint": str(result["checkpoint"])})
            results[stage_name] = result
    finally:
        runtime.shutdown()
    return results


def _start_run(tracker, stage, graph, plan, overrides, fiddlers, parent, experiment_hash):
    if tracker is None:
        return _NoRun()
    from rlhf.tracking.lineage import lineage_params

    params = lineage_params(
        graph=graph,
        overrides=overrides,
        fiddlers=fiddlers,
        parent_run=parent,
        data_fingerprints={},
        plan_text=plan.describe(),
    )
    params["experiment_hash"] = experiment_hash
    return tracker.start_run(stage, params=params, parent_run=parent)
