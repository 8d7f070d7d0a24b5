"""`rlhf diff A B [--config CMD] [--a_config CMD] [--b_config CMD] [--repo .aim] [--stage NAME]`.

What differs between two graphs, leaf by leaf (`rlhf.graph.diff`). A and B are each an
experiment file (with the overrides of `--config`, applied to both, then `--a_config`/`--b_config`),
a fiddle JSON file, or an Aim run hash (or a prefix of one). A run stores one stage graph: against an experiment file it is compared with that
stage of the experiment (`--stage` to choose another).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlhf.cli.experiment import experiment_graph
from rlhf.cli.rerun import load_run_graph
from rlhf.graph.diff import diff_graphs, format_diff
from rlhf.graph.io import GraphSourceError, from_json

__all__ = ["diff_main"]


def diff_main(argv: Sequence[str]) -> int:
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
    if spec.endswith(".py"):
        name = f"{spec} {' '.join(commands)}".strip()
        return experiment_graph(spec, commands), None, name
    try:
        if spec.endswith(".json") and Path(spec).is_file():
            return from_json(Path(spec).read_text()), None, spec
        graph, run = load_run_graph(repo, spec)
    except GraphSourceError as err:
        sys.exit(f"error: {spec}: {err}")
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
