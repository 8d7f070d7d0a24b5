"""The `rlhf diff|viz|rerun|ui` subcommands (argument parsing; the work is in provenance, viz, ui).

    rlhf diff A B [--config CMD] [--a_config CMD] [--b_config CMD] [--repo .aim] [--stage NAME]
    rlhf viz experiments/x.py --out DIR [--config CMD ...] [--stages a,b]
    rlhf rerun RUN_HASH [--repo .aim] [--local] [--config set:PATH=VALUE ...]
    rlhf ui [--repo .aim] [--port PORT] [--sweep ID] [--metric NAME ...]

A and B of `diff` are each an experiment file (with the overrides of `--config`, applied to
both, then `--a_config`/`--b_config`), a fiddle JSON file, or an Aim run hash (or a prefix of
one). A run stores one stage graph: against an experiment file it is compared with that
stage of the experiment (`--stage` to choose another).
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

USAGE = {
    "diff": "rlhf diff A B [--config CMD] [--a_config CMD] [--b_config CMD] [--repo .aim] [--stage NAME]",
    "viz": "rlhf viz experiments/x.py --out DIR [--config CMD ...] [--stages a,b]",
    "rerun": "rlhf rerun RUN_HASH [--repo .aim] [--local] [--config set:PATH=VALUE ...]",
    "ui": "rlhf ui [--repo .aim] [--port PORT] [--sweep ID] [--metric NAME ...]",
}


def main(command: str, argv: Sequence[str]) -> int:
    return {"diff": diff_main, "viz": viz_main, "rerun": rerun_main, "ui": ui_main}[command](list(argv))


def _experiment_graph(path: str, commands: Sequence[str]) -> Any:
    from rlhf.cli import load_experiment
    from rlhf.config.cli import build_graph
    from rlhf.config.overrides import OverrideError

    try:
        return build_graph(load_experiment(path), commands)[0]
    except OverrideError as err:
        sys.exit(f"error: {path}: {err}")


# --------------------------------------------------------------------------- diff
def diff_main(argv: list[str]) -> int:
    from rlhf.config.provenance import diff_graphs, format_diff

    p = argparse.ArgumentParser(prog="rlhf diff", description="Show how two graphs differ (leaf by leaf).")
    p.add_argument("a", help="experiment .py file, fiddle .json file, or Aim run hash")
    p.add_argument("b", help="experiment .py file, fiddle .json file, or Aim run hash")
    p.add_argument("--config", action="append", default=[], metavar="CMD", help="overrides for both experiment files")
    p.add_argument("--a_config", action="append", default=[], metavar="CMD", help="A's own overrides (after --config)")
    p.add_argument("--b_config", action="append", default=[], metavar="CMD", help="B's own overrides (after --config)")
    p.add_argument("--repo", default=".aim", help="Aim repo of run hashes (default .aim)")
    p.add_argument("--stage", default=None, help="compare this stage of experiment files")
    args = p.parse_args(argv)
    a, a_stage, a_name = _side(args.a, [*args.config, *args.a_config], args.repo)
    b, b_stage, b_name = _side(args.b, [*args.config, *args.b_config], args.repo)
    stage = args.stage or a_stage or b_stage
    if stage is not None:  # compare stage graphs
        a, a_name = _stage_of(a, a_stage, stage, a_name)
        b, b_name = _stage_of(b, b_stage, stage, b_name)
    print(format_diff(diff_graphs(a, b), a_name, b_name))
    return 0


def _side(spec: str, commands: Sequence[str], repo: str) -> tuple[Any, str | None, str]:
    """(graph, the stage it is if it is one stage's graph, a name for it)."""
    from rlhf.config.graph_io import from_json
    from rlhf.config.provenance import load_run_graph

    if spec.endswith(".py"):
        name = f"{spec} {' '.join(commands)}".strip()
        return _experiment_graph(spec, commands), None, name
    if spec.endswith(".json") and Path(spec).is_file():
        return from_json(Path(spec).read_text()), None, spec
    try:
        graph, run = load_run_graph(repo, spec)
    except (LookupError, FileNotFoundError) as err:
        sys.exit(f"error: {spec!r} is not an experiment .py file, a fiddle .json file, or a run: {err}")
    stage = run["params"].get("stage")
    return graph, stage, f"run {run['hash']} ({run['experiment']}, stage {stage})"


def _stage_of(graph: Any, own_stage: str | None, stage: str, name: str) -> tuple[Any, str]:
    if own_stage is not None:
        return graph, name  # already one stage's graph
    stages = getattr(graph, "stages", None)
    if not isinstance(stages, dict) or stage not in stages:
        sys.exit(f"error: {name} has no stage {stage!r} (stages: {', '.join(stages or [])})")
    return stages[stage], f"{name} [stage {stage}]"


# --------------------------------------------------------------------------- viz
def viz_main(argv: list[str]) -> int:
    from rlhf.config.viz import DOT_MISSING, write_viz

    p = argparse.ArgumentParser(prog="rlhf viz", description="Write each stage graph as SVG/DOT and the Plan as text.")
    p.add_argument("experiment")
    p.add_argument("--out", required=True, help="folder for <stage>.svg, <stage>.dot, plan.txt")
    p.add_argument("--config", action="append", default=[], metavar="CMD")
    p.add_argument("--stages", default=None, help="comma-separated stages (default: all)")
    args = p.parse_args(argv)
    graph = _experiment_graph(args.experiment, args.config)
    files, have_dot = write_viz(graph, args.out, args.stages.split(",") if args.stages else None)
    for f in files:
        print(f"wrote {f}")
    if not have_dot:
        print(DOT_MISSING)
    return 0


# --------------------------------------------------------------------------- rerun
def rerun_main(argv: list[str]) -> int:
    from rlhf.config.cli import format_results
    from rlhf.config.overrides import OverrideError
    from rlhf.config.provenance import rerun
    from rlhf.config.validate import PreflightError

    p = argparse.ArgumentParser(
        prog="rlhf rerun",
        description="Run the stage graph an Aim run stored (graph_json) again, as a one-stage experiment. "
        "StageOutput references were stored resolved (e.g. the SFT checkpoint path), so it runs standalone.",
    )
    p.add_argument("run", help="Aim run hash (or a unique prefix)")
    p.add_argument("--repo", default=".aim", help="Aim repo to read the run from and record the new run in")
    p.add_argument("--local", action="store_true", help="run in-process (LocalRuntime) instead of on Ray")
    p.add_argument("--output_dir", default="outputs")
    p.add_argument("--config", action="append", default=[], metavar="set:PATH=VALUE",
                   help="change the stored graph (paths start at stages.<stage>)")
    args = p.parse_args(argv)
    try:
        results = rerun(args.run, args.repo, local=args.local, output_dir=args.output_dir, commands=args.config)
    except (LookupError, FileNotFoundError, OverrideError, PreflightError) as err:
        sys.exit(f"error: {err}")
    print(format_results(results))
    return 0


# --------------------------------------------------------------------------- ui
def ui_main(argv: list[str]) -> int:
    from rlhf.config.ui import AimUI, sweep_url

    p = argparse.ArgumentParser(prog="rlhf ui", description="Start Aim's UI on loopback and link to the latest sweep.")
    p.add_argument("--repo", default=".aim", help="Aim repo (default .aim)")
    p.add_argument("--port", type=int, default=None, help="port (default: a free one)")
    p.add_argument("--sweep", default=None, help="sweep id to link to (default: the latest)")
    p.add_argument("--metric", action="append", default=None, help="metric to chart (default: the headline ones)")
    args = p.parse_args(argv)
    ui = AimUI(args.repo, port=args.port)
    signal.signal(signal.SIGTERM, _interrupt)  # a plain `kill` also stops aim up's process group
    try:
        ui.start()
        print(f"Aim UI: {ui.url}/  (aim up process group {ui.proc.pid}; Ctrl-C stops it)", flush=True)
        try:
            print(f"sweep: {sweep_url(ui.url, args.repo, args.sweep, args.metric)}", flush=True)
        except LookupError as err:
            print(f"({err})", flush=True)
        while ui.proc is not None and ui.proc.poll() is None:
            time.sleep(0.5)
        return 1  # aim up ended on its own
    except KeyboardInterrupt:
        return 0
    except (FileNotFoundError, RuntimeError, TimeoutError) as err:
        sys.exit(f"error: {err}")
    finally:
        ui.stop()


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt
