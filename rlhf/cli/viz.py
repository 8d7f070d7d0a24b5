"""Pictures of an experiment: each stage graph as Graphviz (fiddle's renderer), and the compiled Plan.

`write_viz(graph, out_dir)` writes `<stage>.dot` for every stage, `<stage>.svg` where
Graphviz's `dot` program is installed (Debian/Ubuntu: `apt-get install graphviz`), and
`plan.txt`: each stage's Plan (worker groups and resources) and the batch arithmetic.
"""

from __future__ import annotations

import argparse
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import fiddle as fdl

from rlhf.cli.experiment import experiment_graph
from rlhf.runtime.plan import compile_graph
from rlhf.runtime.preflight import batch_arithmetic, batch_table

__all__ = ["DOT_MISSING", "viz_main", "write_viz"]

DOT_MISSING = (
    "Graphviz's `dot` program is not installed, so only .dot files were written. Install it "
    "(Debian/Ubuntu: apt-get install -y graphviz; macOS: brew install graphviz) to get SVGs, "
    "or render a .dot file elsewhere: dot -Tsvg STAGE.dot -o STAGE.svg"
)


def write_viz(graph: Any, out_dir: str | Path, stages: Sequence[str] | None = None) -> tuple[list[Path], bool]:
    """Write the stage pictures and plan.txt to `out_dir`; returns (files written, whether SVGs were made)."""
    from fiddle import graphviz as fiddle_graphviz  # imports the graphviz package (~1 s): only for pictures

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    have_dot = shutil.which("dot") is not None
    files: list[Path] = []
    plan_text: list[str] = []
    all_stages = dict(fdl.ordered_arguments(graph, include_defaults=True)["stages"])
    for name, stage in all_stages.items():
        if stages is not None and name not in stages:
            continue
        rendered = fiddle_graphviz.render(stage)
        dot = out / f"{_safe(name)}.dot"
        dot.write_text(rendered.source)
        files.append(dot)
        if have_dot:
            svg = out / f"{_safe(name)}.svg"
            svg.write_bytes(rendered.pipe(format="svg"))
            files.append(svg)
        plan_text.append(f"[{name}]\n{compile_graph(stage).describe()}\n")
    batches = batch_arithmetic(graph, stages)
    if batches:
        plan_text.append(batch_table(batches) + "\n")
    plan = out / "plan.txt"
    plan.write_text("\n".join(plan_text))
    files.append(plan)
    return files, have_dot


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def viz_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="rlhf viz", description="Write each stage graph as SVG/DOT and the Plan as text.")
    p.add_argument("experiment")
    p.add_argument("--out", required=True, help="folder for <stage>.svg, <stage>.dot, plan.txt")
    p.add_argument("--config", action="append", default=[], metavar="CMD")
    p.add_argument("--stages", default=None, help="comma-separated stages (default: all)")
    args = p.parse_args(argv)
    graph = experiment_graph(args.experiment, args.config)
    files, have_dot = write_viz(graph, args.out, args.stages.split(",") if args.stages else None)
    for f in files:
        print(f"wrote {f}")
    if not have_dot:
        print(DOT_MISSING)
    return 0
