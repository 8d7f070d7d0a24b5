"""The command line of an experiment file: `python experiments/x.py --config fiddler:tiny ...`.

Every experiment ends with `if __name__ == "__main__": run_cli(sys.modules[__name__])`
(`rlhf run|plan|show x.py` load the file with `load_experiment` and do the same). Fiddlers are
looked up in the experiment module first, then in `rlhf_configs.common` (shared ones such as
`local` and `no_tracking`). Before a run, the preflight runs inside `run_experiment`;
`--print_plan` runs the same preflight and stops.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import os
import sys
import types
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

import rlhf_configs.common as common
from rlhf.cli.errors import one_line_errors
from rlhf.cli.signals import honour_interrupts
from rlhf.config.overrides import OverrideError, apply_overrides
from rlhf.config.provenance import format_provenance
from rlhf.runtime.experiment import run_experiment
from rlhf.runtime.plan import compile_graph, plan_model_path
from rlhf.runtime.preflight import PreflightError, batch_arithmetic, batch_table, memory_table, preflight
from rlhf.sweeps import sweep_from_cli

__all__ = ["build_graph", "experiment_graph", "format_results", "load_experiment", "run_cli"]


def load_experiment(path: str) -> types.ModuleType:
    """The experiment file at `path` as a module named after the file (the project root on `sys.path`)."""
    file = Path(path)
    if not file.is_file():
        sys.exit(f"error: no experiment file {path!r} (e.g. experiments/arithmetic_tiny.py)")
    sys.path.insert(0, str(file.resolve().parent.parent))  # the project root, for rlhf_configs
    spec = importlib.util.spec_from_file_location(file.stem, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[file.stem] = module
    spec.loader.exec_module(module)
    return module


def _parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="Run an rlhf experiment graph.")
    p.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="CMD",
        help="config:NAME(...) | fiddler:NAME(...) | set:PATH=VALUE; applied in order (default config:base)",
    )
    p.add_argument("--print_graph", action="store_true", help="print the graph and exit")
    p.add_argument("--print_plan", action="store_true",
                   help="print each stage's execution plan, run the preflight checks, and exit (non-zero when the "
                        "run would refuse to start)")
    p.add_argument("--allow_changes", "--allow-changes", action="store_true",
                   help="continue a named run (run_name) whose graph changed in ways other than its model or "
                        "algorithm, e.g. more steps; the changes are recorded in the run")
    p.add_argument("--stages", default=None, help="comma-separated stages to run (default: all)")
    p.add_argument("--sweep", default=None, metavar="NAME",
                   help="run the experiment's sweep function NAME (sweep:NAME, NAME, 'NAME(k=v)'): runs per member")
    p.add_argument("--sweep_parallel", type=int, default=1, metavar="N",
                   help="sweep members run at once, each in its own process (default 1: one after another)")
    return p


def build_graph(module: types.ModuleType, commands: Sequence[str]) -> tuple[Any, list[str]]:
    """The graph of `module` after the `--config` commands; returns (graph, the fiddlers applied)."""
    return apply_overrides(commands, [module, common])


def experiment_graph(path: str, commands: Sequence[str]) -> Any:
    """The graph of the experiment file at `path` after `commands`; a bad override exits with its message."""
    try:
        return build_graph(load_experiment(path), commands)[0]
    except OverrideError as err:
        sys.exit(f"error: {path}: {err}")


def format_results(results: Mapping[str, Mapping[str, Any]]) -> str:
    """The final table: per stage, its Aim run, its headline (validation) metrics, its checkpoint."""
    table = Table(title="results")
    def headline(name: str) -> bool:  # mean@n and pass@k (k > 1); maj/best@n and pass@1 repeat them for greedy runs
        return name.startswith("val-core/") and "/maj@" not in name and "/best@" not in name and not name.endswith("/pass@1")

    metric_names = sorted({k for r in results.values() for k in r.get("metrics", {}) if headline(k)})
    table.add_column("stage")
    table.add_column("aim run")
    for name in metric_names:
        table.add_column(name.removeprefix("val-core/"), justify="right")
    table.add_column("checkpoint")
    for stage, r in results.items():
        values = [f"{r['metrics'][m]:.3f}" if m in r.get("metrics", {}) else "" for m in metric_names]
        table.add_row(stage, str(r.get("run_hash") or "-"), *values, str(r.get("checkpoint", "")))
    console = Console(width=160, record=True, file=open(os.devnull, "w"))
    console.print(table)
    return console.export_text()


def run_cli(module: types.ModuleType, argv: Sequence[str] | None = None) -> dict[str, Any] | None:
    """Parse `argv` (default: `sys.argv[1:]`), build the graph, and run, print or sweep it."""
    honour_interrupts()
    if module.__name__ == "__main__" and isinstance(getattr(module, "__file__", None), str):
        # `python x.py`: build from the file loaded as module `x`, as `rlhf run x.py` does, so the graph names its
        # callables `x.fn` (a later process can load them: rlhf.graph.io) and hashes the same either way
        module = load_experiment(module.__file__)
    args = _parser(os.path.basename(getattr(module, "__file__", "experiment"))).parse_args(argv)
    try:
        graph, fiddlers = build_graph(module, args.config)
    except OverrideError as err:
        sys.exit(f"error: {err}")
    stages = args.stages.split(",") if args.stages else None
    if args.sweep:
        with one_line_errors(resume_hint(graph)):
            return sweep_from_cli([module, common], graph, args.sweep, parallel=args.sweep_parallel, stages=stages,
                                  overrides=args.config, fiddlers=fiddlers, dry_run=args.print_graph or args.print_plan)
    if args.print_graph:  # each value with where it was set (rlhf.config.provenance)
        print(format_provenance(graph))
        return None
    if args.print_plan:  # the same preflight as a real run: a plan the run would refuse exits non-zero
        try:
            report = preflight(graph, stages, allow_changes=args.allow_changes)
        except PreflightError as err:
            sys.exit(f"error: {err}")
        stage_models: dict[str, str] = {}  # stage -> the model it starts from (its output has that shape)
        for name, stage in graph.stages.items():
            plan = compile_graph(stage)
            resolve = functools.partial(plan_model_path, stage_models=stage_models)
            if stages is None or name in stages:
                print(f"[{name}]\n{plan.describe(resolve)}\n")
            if "policy" in plan.groups and (path := resolve(plan.worker_arguments("policy")["model_path"])):
                stage_models[name] = path
        if report.batches:
            print(batch_table(report.batches))
        if report.memory:
            print(memory_table(report.memory))
        return None
    batches = batch_arithmetic(graph, stages)
    if batches:
        print(batch_table(batches))
    with one_line_errors(resume_hint(graph)):
        results = run_experiment(graph, overrides=args.config, fiddlers=fiddlers, stages=stages,
                                 allow_changes=args.allow_changes)
    print(format_results(results))
    return results


def resume_hint(graph: Any) -> str:
    """How to go on after an interrupt or a fixed error: a named run resumes, another starts afresh."""
    if getattr(graph, "run_name", None) is not None:
        return "run the same command again to resume from the newest checkpoint"
    return ("this run has no run_name, so running it again starts afresh in a new folder (give it one with "
            "--config \"set:run_name='NAME'\" to make it resumable)")
