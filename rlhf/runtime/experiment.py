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
import contextlib
import json
import logging
import os
import signal
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import fiddle as fdl

from rlhf.graph.io import graph_hash
from rlhf.runtime.local import LocalRuntime
from rlhf.runtime.plan import bind_groups, compile_graph
from rlhf.runtime.preflight import preflight
from rlhf.runtime.run_lock import run_folder_lock
from rlhf.runtime.run_record import RunRecord
from rlhf.runtime.stage_reuse import FinishedStages, upstream_stages
from rlhf.runtime.stages import resolve_stage_outputs, stage_references
from rlhf.tracking.lineage import lineage_params
from rlhf.trainers.context import StageContext

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Experiment:
    """The root of an experiment graph (the runner reads it; it is never built as a whole)."""

    name: str  # experiment name: Aim experiment, output folder
    stages: dict[str, Any]  # stage name -> stage graph (a trainer with `.run(ctx)`), run in order
    runtime: Any = None  # RayRuntime / LocalRuntime config; None: LocalRuntime
    tracker: Any = None  # AimTracker config; None: no tracking
    output_dir: str = "outputs"  # checkpoints go to <output_dir>/<name>/<run_name or timestamp>/<stage>
    progress: bool = True  # progress bars on the console
    run_name: str | None = None  # a stable output folder: rerunning the same command resumes it
    # a stage a later stage starts from is taken from an earlier run when one finished with the same graph and
    # data (rlhf.runtime.stage_reuse), e.g. the SFT stage of every member of a sweep over a GRPO setting;
    # None: on for the members of a sweep, off for a single run (a rerun of one command trains every stage again)
    reuse_upstream: bool | None = None
    reuse_dir: str | None = None  # where finished upstream stages are indexed; None: output_dir (a sweep: its base)


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


def run_experiment(
    graph: fdl.Config,
    overrides: Sequence[str] = (),
    fiddlers: Sequence[str] = (),
    stages: Sequence[str] | None = None,
    *,
    run_params: Mapping[str, Any] | None = None,
    tags: Sequence[str] = (),
    allow_changes: bool = False,
) -> dict[str, dict[str, Any]]:
    """Run the stages of an Experiment graph in order; returns each stage's result (+ run hash).

    `run_params` are added to every stage's tracking run (a sweep's `sweep` params), and `tags`
    tag each run. Before anything starts, the preflight (`rlhf.runtime.preflight.preflight`) checks
    the graph, calls the components' preflight hooks and, for a named run that exists, compares
    the graph with the one it was started with; it raises one PreflightError naming every problem.
    `allow_changes` continues a named run whose graph changed in ways other than its model or
    algorithm (recorded in `experiment.json` and in each stage's Aim run as `invocations`).
    """
    if fdl.get_callable(graph) is not Experiment:
        raise TypeError(f"the root of an experiment graph must be fdl.Config(Experiment, ...), got {graph!r}")
    preflight(graph, stages, allow_changes=allow_changes)
    resumable = graph.run_name is not None
    run_folder = graph.run_name or datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out_root = Path(graph.output_dir) / graph.name / run_folder
    sweep = (run_params or {}).get("sweep")
    run_label = f"{run_folder}#{sweep['index']}" if isinstance(sweep, dict) and "index" in sweep else run_folder
    selected = [name for name in graph.stages if stages is None or name in stages]
    with run_folder_lock(out_root):  # a second job on this run folder is refused here, naming this one
        return _run_stages(graph, selected, out_root, resumable, run_label, overrides=overrides, fiddlers=fiddlers,
                           run_params=run_params, tags=tags, allow_changes=allow_changes)


def _run_stages(graph, selected, out_root, resumable, run_label, *, overrides, fiddlers, run_params, tags,
                allow_changes) -> dict[str, dict[str, Any]]:
    """The selected stages in order, in a run folder this job holds; a finished one is skipped."""
    record, invocation = None, {}
    if resumable:
        record = RunRecord(out_root)
        invocation = record.record(graph, selected, overrides=overrides, fiddlers=fiddlers, allow_changes=allow_changes)
        for stage_name, lines in invocation["changes"].items():
            log.warning("continuing stage %r of %s with changes (--allow_changes):\n    %s", stage_name, out_root,
                        "\n    ".join(lines))
    with terminate_as_interrupt():  # SIGTERM, like Ctrl-C, leaves through the `finally` below
        runtime = fdl.build(graph.runtime) if graph.runtime is not None else LocalRuntime()
        tracker = fdl.build(graph.tracker) if graph.tracker is not None else None
        experiment_hash = graph_hash(graph)
        results: dict[str, dict[str, Any]] = {}
        finished, upstream = _reuse(graph)
        try:
            for stage_name in selected:
                stage_dir = out_root / stage_name
                if record is not None and (done := record.finished_result(graph, stage_name)) is not None:
                    results[stage_name] = done  # finished earlier, by this graph on these data
                    continue
                if stage_name in upstream and (done := finished.find(graph, stage_name)) is not None:
                    print(f"stage {stage_name!r}: reusing the finished run in {done['reused_from']} (same graph "
                          f"and data; Aim run {done.get('run_hash') or '-'})", flush=True)
                    results[stage_name] = done
                    continue
                invocations = record.start_stage(graph, stage_name, invocation) if record is not None else []
                results[stage_name] = _run_stage(
                    graph, stage_name, stage_dir, results, runtime, tracker, experiment_hash, invocations,
                    overrides=overrides, fiddlers=fiddlers, run_params=run_params, tags=tags, resumable=resumable,
                    run_label=run_label,
                )
                if record is not None:
                    record.write_result(stage_name, results[stage_name])
                if stage_name in upstream:
                    finished.add(graph, stage_name, stage_dir, results[stage_name])
        finally:
            runtime.shutdown()
    return results


def _reuse(graph) -> tuple[FinishedStages | None, set[str]]:
    """The index of finished stages this graph shares, and its stages that may be taken from it."""
    if not graph.reuse_upstream:
        return None, set()
    return FinishedStages(graph.reuse_dir or graph.output_dir), upstream_stages(graph)


class Terminated(KeyboardInterrupt):
    """SIGTERM reached the driver: stop like Ctrl-C (groups stopped, runs closed as interrupted)."""


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """Turn SIGTERM into `Terminated` for this block, so `finally` clauses run.

    By default SIGTERM ends Python at once: no `finally`, so a local Ray cluster the driver
    started (GCS, raylet, workers) outlives it, and the Aim run stays "running". Installed only
    in the main thread and only over the default handler (a handler someone set is kept).
    """
    main = threading.current_thread() is threading.main_thread()
    if not main or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return
    received: list[int] = []

    def handler(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the clean-up short
        received.append(signum)
        raise Terminated(f"signal {signal.Signals(signum).name}")

    signal.signal(signal.SIGTERM, handler)
    try:
        yield
    except KeyboardInterrupt as err:
        if received and not isinstance(err, Terminated):  # `ray.get` re-raises any signal as a plain KeyboardInterrupt
            raise Terminated(f"signal {signal.Signals(received[0]).name}") from err
        raise
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _run_stage(graph, stage_name, stage_dir, results, runtime, tracker, experiment_hash, invocations, *,
               overrides, fiddlers, run_params, tags, resumable, run_label) -> dict[str, Any]:
    """One stage: resolve its inputs, open (or reopen) its run, start its groups, run it, stop them."""
    stage_graph = graph.stages[stage_name]
    refs = stage_references(stage_graph)
    parent = next((results[r.stage].get("run_hash") for r in refs if r.stage in results), None)
    declared = getattr(stage_graph, "parent_run", None)  # e.g. EvalJob(parent_run=<the RL run>)
    if parent is None and isinstance(declared, str):
        parent = declared
    resolved = resolve_stage_outputs(stage_graph, results, stage_name)
    plan = compile_graph(resolved)
    previous = _read_json(stage_dir / _RUN).get("run_hash") if resumable else None
    if tracker is not None and previous:
        run = tracker.resume_run(previous)  # this invocation's graph and overrides replace the last ones
        run.set_params(_lineage(resolved, plan, overrides, fiddlers, parent, experiment_hash))
    else:
        run = _start_run(tracker, stage_name, resolved, plan, overrides, fiddlers, parent, experiment_hash,
                         run_params, tags, name=f"{graph.name}/{run_label}/{stage_name}")
    with run:
        if invocations:
            run.set_params({"invocations": invocations})
        reused = {r.stage: results[r.stage]["reused_from"] for r in refs if "reused_from" in results.get(r.stage, {})}
        if reused:  # its parent run is the reused one; where it ran, too
            run.set_params({"reused_stages": reused})
        if resumable and run.hash:
            _write_json(stage_dir / _RUN, {"run_hash": run.hash})
        groups = runtime.start_groups(plan)
        try:
            stage = fdl.build(bind_groups(plan.driver, groups))
            ctx = StageContext(
                out_dir=stage_dir,
                log=run.track,
                record=run.set_params,
                name=stage_name,
                progress=graph.progress,
                resume=resumable,
            )
            result = dict(stage.run(ctx))
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the whole runtime goes now (see RayRuntime.shutdown)
            runtime.shutdown()
            raise
        finally:
            runtime.stop_groups()
        result["run_hash"] = run.hash
        result["parent_run"] = parent
        if "checkpoint" in result:
            run.set_params({"checkpoint": str(result["checkpoint"])})
    return result


_RUN = "run.json"


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def _write_json(path: Path, data: Mapping[str, Any]) -> None:
    """Atomic: a crash leaves the old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, default=str, indent=1))
    os.replace(tmp, path)


def _lineage(graph, plan, overrides, fiddlers, parent, experiment_hash) -> dict[str, Any]:
    params = lineage_params(
        graph=graph,
        overrides=overrides,
        fiddlers=fiddlers,
        parent_run=parent,
        data_fingerprints={},
        plan_text=plan.describe(),
    )
    params["experiment_hash"] = experiment_hash
    return params


def _start_run(tracker, stage, graph, plan, overrides, fiddlers, parent, experiment_hash, run_params=None, tags=(),
               name=None):
    if tracker is None:
        return _NoRun()
    params = _lineage(graph, plan, overrides, fiddlers, parent, experiment_hash)
    params.update(run_params or {})
    return tracker.start_run(stage, name=name, params=params, parent_run=parent, tags=tags)
