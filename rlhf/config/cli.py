"""The command line of an experiment file: `python experiments/x.py --config fiddler:tiny ...`.

Every experiment ends with `if __name__ == "__main__": run_cli(sys.modules[__name__])`.
Fiddlers are looked up in the experiment module first, then in `rlhf_configs.common`
(shared ones such as `local` and `no_tracking`).
"""

from __future__ import annotations

import argparse
import functools
import os
import signal
import sys
import threading
import types
from collections.abc import Mapping, Sequence
from typing import Any

from rlhf.config.overrides import OverrideError, apply_overrides


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
    import rlhf_configs.common as common

    return apply_overrides(commands, [module, common])


def format_results(results: Mapping[str, Mapping[str, Any]]) -> str:
    """The final table: per stage, its Aim run, its headline (validation) metrics, its checkpoint."""
    from rich.console import Console
    from rich.table import Table

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


def honour_interrupts() -> None:
    """Make SIGINT (Ctrl-C) stop this process even when it was started with SIGINT ignored.

    A shell starts background jobs (`cmd &`, CI scripts) with SIGINT ignored, and Python then
    installs no KeyboardInterrupt handler, so `rlhf ui` would never stop aim up and a sweep's
    members would not close their runs as interrupted when asked to. Entry points call this
    first; a handler someone installed on purpose is left alone.
    """
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def run_cli(module: types.ModuleType, argv: Sequence[str] | None = None) -> dict[str, Any] | None:
    honour_interrupts()
    import rlhf_configs.common as common
    from rlhf.config.checks import batch_arithmetic, batch_table, validate
    from rlhf.config.provenance import format_provenance
    from rlhf.config.sweeps import SweepError, sweep_from_cli
    from rlhf.config.validate import PreflightError
    from rlhf.runtime.experiment import run_experiment
    from rlhf.runtime.plan import compile_graph, plan_model_path

    args = _parser(os.path.basename(getattr(module, "__file__", "experiment"))).parse_args(argv)
    try:
        graph, fiddlers = build_graph(module, args.config)
    except OverrideError as err:
        sys.exit(f"error: {err}")
    stages = args.stages.split(",") if args.stages else None
    if args.sweep:
        try:
            return sweep_from_cli([module, common], graph, args.sweep, parallel=args.sweep_parallel, stages=stages,
                                  overrides=args.config, fiddlers=fiddlers, dry_run=args.print_graph or args.print_plan)
        except (OverrideError, PreflightError, SweepError) as err:
            sys.exit(f"error: {err}")
    if args.print_graph:  # each value with where it was set (rlhf.config.provenance)
        print(format_provenance(graph))
        return None
    if args.print_plan:  # the same preflight as a real run: a plan the run would refuse exits non-zero
        try:
            report = validate(graph, stages, allow_changes=args.allow_changes)
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
        return None
    batches = batch_arithmetic(graph, stages)
    if batches:
        print(batch_table(batches))
    try:
        results = run_experiment(graph, overrides=args.config, fiddlers=fiddlers, stages=stages,
                                 allow_changes=args.allow_changes)
    except PreflightError as err:
        sys.exit(f"error: {err}")
    print(format_results(results))
    return results
