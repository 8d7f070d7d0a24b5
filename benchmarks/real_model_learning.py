"""Does RL make a real pretrained model better? A recipe's RL stage, base vs trained, on its held-out rows.

Runs a recipe (default experiments/smollm2_arithmetic.py; any with one RL stage and an evaluator:
`--recipe FILE`) as it is (LocalRuntime, no Aim), with held-out validation before training and every
`--test-freq` steps, and reports greedy held-out accuracy before and after. The metric names come from
the graph: `val-core/<source>/reward/mean@<n>` for each data source of the evaluator's rows (the
accuracy: their mean), and `val-aux/<source>/<name>/mean@<n>` for each of its aux rewards (the first one
is reported as the lenient accuracy: the arithmetic recipe's "last_number"). The curve holds every
validation and every step's mean training reward.

    OMP_NUM_THREADS=1 python benchmarks/real_model_learning.py    # CPU, fp32
    OMP_NUM_THREADS=1 python benchmarks/real_model_learning.py --recipe experiments/my_recipe.py --out results/
    VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CPU_KVCACHE_SPACE=1 OMP_NUM_THREADS=1 \\
        .venv-vllm/bin/python benchmarks/real_model_learning.py --engine vllm            # the same graph on vllm-cpu

Writes <out>/real_model_learning-<recipe>-<engine>-<time>.json (out: a folder outside the repository,
$TMPDIR/rlhf-benchmarks, unless `--out` names one: `--out benchmarks/results` to keep it) with top-level
`base_accuracy` and `trained_accuracy` (fractions), `base_lenient` and `trained_lenient`, every metric's
before/after, the curve, the settings, the wall time and the load average.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import fiddle as fdl
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from scratch import report_pruned  # noqa: E402  logs stay, checkpoints go
DEFAULT_RECIPE = ROOT / "experiments" / "smollm2_arithmetic.py"
DEFAULT_OUT = Path(tempfile.gettempdir()) / "rlhf-benchmarks"
"""Where results go without --out: outside the repository, so a run leaves the checkout clean."""
TRAINING = ("critic/score/mean", "response_length/mean", "timing_s/gen", "timing_s/update_actor", "timing_s/step",
            "actor/entropy")


class CurveTracker:
    """A tracker that keeps every logged step's headline metrics in memory (and prints them)."""

    curve: list[dict] = []  # class-level: the runner builds its own instance from the graph
    kept: tuple[str, ...] = TRAINING  # the training metrics and the held-out ones (set before the run)
    start = time.perf_counter()

    def start_run(self, stage: str, **lineage) -> CurveTracker:  # lineage: name, params, parent_run, tags
        return self

    hash = None

    def track(self, metrics: Mapping[str, float], step: int) -> None:
        point = {"step": step, "wall_s": round(time.perf_counter() - CurveTracker.start, 1)}
        point.update({k: round(float(metrics[k]), 4) for k in CurveTracker.kept if k in metrics})
        CurveTracker.curve.append(point)
        print(json.dumps(point), flush=True)

    def set_params(self, params: Mapping) -> None:
        pass

    def __enter__(self) -> CurveTracker:
        return self

    def __exit__(self, *exc) -> bool:
        return False


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default=str(DEFAULT_RECIPE), help="the experiment file to measure")
    parser.add_argument("--engine", choices=["transformers", "vllm"], default="transformers")
    parser.add_argument("--test-freq", type=int, default=0, help="validate every k steps (0: before and after only)")
    parser.add_argument("--config", action="append", default=[], metavar="CMD",
                        help="more overrides of the recipe (e.g. 'config:base(steps=32)', set:stages.grpo.lr=1e-5)")
    parser.add_argument("--out", default=None, help=f"results folder (default {DEFAULT_OUT}, outside the repository)")
    return parser.parse_args(argv)


def rl_stage(graph: fdl.Config) -> str:
    """The name of the graph's one RL stage (an RLTrainer with an evaluator): what this benchmark measures."""
    from rlhf.trainers.rl import RLTrainer

    names = [name for name, stage in graph.stages.items() if fdl.get_callable(stage) is RLTrainer]
    if len(names) != 1:
        raise ValueError(f"the recipe has {len(names)} RL stages ({', '.join(names) or 'none'}); this benchmark "
                         "measures a recipe with exactly one. Fix: pass --recipe with one RLTrainer stage")
    if getattr(graph.stages[names[0]], "evaluator", None) is None:
        raise ValueError(f"stage {names[0]!r} has no evaluator: nothing is measured on held-out rows. Fix: give its "
                         "RLTrainer an evaluator=Evaluator(...) on held-out rows")
    return names[0]


def heldout_metrics(stage: fdl.Config) -> dict[str, Any]:
    """The metric names the stage's evaluator logs, read from the graph (its rows are built, not the model):
    {"accuracy": [val-core/<source>/reward/mean@<n> per data source], "aux": {name: [val-aux/<source>/<name>/mean@<n>]},
    "heldout_rows": how many rows it validates on}."""
    from rlhf.data.arrow import data_sources

    evaluator = stage.evaluator
    rows = fdl.build(evaluator.dataset.rows)
    sources = sorted(data_sources(rows) if hasattr(rows, "data") else {row["data_source"] for row in rows})
    sampling = evaluator.sampling
    n = (fdl.build(sampling) if isinstance(sampling, fdl.Buildable) else sampling).n
    aux = list(getattr(evaluator, "aux_rewards", None) or {})
    return {"accuracy": [f"val-core/{s}/reward/mean@{n}" for s in sources],
            "aux": {name: [f"val-aux/{s}/{name}/mean@{n}" for s in sources] for name in aux},
            "heldout_rows": len(rows)}


def prepare(args: argparse.Namespace) -> tuple[fdl.Config, str, dict[str, Any]]:
    """The recipe's graph as the benchmark runs it (in-process, quiet, validation before training and every
    --test-freq steps, the curve tracker), its RL stage's name and its held-out metric names."""
    from rlhf.cli.experiment import build_graph, load_experiment

    recipe = load_experiment(args.recipe)
    configs = [c for c in args.config if c.startswith("config:")]  # a config: command builds the graph: first
    commands = [*configs, "fiddler:local", "fiddler:quiet", *(["fiddler:vllm"] if args.engine == "vllm" else []),
                *(c for c in args.config if c not in configs)]
    graph, _ = build_graph(recipe, commands)
    name = rl_stage(graph)
    stage = graph.stages[name]
    stage.test_freq = args.test_freq
    stage.val_before_train = True  # the base model's accuracy
    graph.tracker = fdl.Config(CurveTracker)
    return graph, name, {**heldout_metrics(stage), "commands": commands}


def _mean(metrics: Mapping[str, float], keys: Sequence[str]) -> float | None:
    return sum(metrics[k] for k in keys) / len(keys) if keys and all(k in metrics for k in keys) else None


def summary(names: Mapping[str, Any], base: Mapping[str, float], trained: Mapping[str, float]) -> dict[str, Any]:
    """base/trained accuracy (the mean over data sources), the first aux reward's as lenient, and every metric."""
    lenient = next(iter(names["aux"].values()), [])
    every = [*names["accuracy"], *(k for keys in names["aux"].values() for k in keys)]
    return {
        "base_accuracy": _mean(base, names["accuracy"]), "trained_accuracy": _mean(trained, names["accuracy"]),
        "base_lenient": _mean(base, lenient), "trained_lenient": _mean(trained, lenient),
        "lenient_metric": next(iter(names["aux"]), None),
        "metrics": {k: {"base": base.get(k), "trained": trained.get(k)} for k in every},
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    from rlhf.graph.io import flatten
    from rlhf.runtime.experiment import run_experiment

    graph, name, names = prepare(args)
    graph.output_dir = tempfile.mkdtemp(prefix="real_model_learning-")  # checkpoints: not kept
    CurveTracker.kept = (*TRAINING, *names["accuracy"], *(k for keys in names["aux"].values() for k in keys))
    load_before = os.getloadavg()
    CurveTracker.start = start = time.perf_counter()
    metrics = run_experiment(graph)[name]["metrics"]
    wall = time.perf_counter() - start
    base = next(p for p in CurveTracker.curve if names["accuracy"][0] in p)
    result = {
        **summary(names, base, metrics),
        "accuracy": "greedy held-out score >= 1 under the recipe's evaluator reward, mean over data sources",
        "recipe": str(Path(args.recipe).resolve()),
        "stage": name,
        "heldout_rows": names["heldout_rows"],
        "engine": args.engine,
        "wall_s": round(wall, 1),
        "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),  # LocalRuntime: one process
        "train_steps_s": round(sum(p.get("timing_s/step", 0.0) for p in CurveTracker.curve), 1),  # without validation
        "load_average": {"before": [round(x, 2) for x in load_before], "after": [round(x, 2) for x in os.getloadavg()]},
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, 1 thread",
        "command": " ".join([f"{Path(sys.executable).parents[1].name}/bin/python", *sys.argv]),  # .venv or .venv-vllm
        "overrides": names["commands"],
        "settings": flatten(graph.stages[name]),  # the whole stage graph, every default included
        "curve": CurveTracker.curve,
    }
    path = write_result(result, args)
    report_pruned(graph.output_dir)
    print(f"\nwrote {path}\n")
    for label, key in (("accuracy", "accuracy"), (result["lenient_metric"] or "lenient", "lenient")):
        before, after = result[f"base_{key}"], result[f"trained_{key}"]
        if before is not None and after is not None:
            print(f"held-out {label:<12} {100 * before:.1f}% -> {100 * after:.1f}%")
    print(f"wall {wall / 60:.1f} min ({args.engine}), peak RSS {result['peak_rss_gib']} GiB, "
          f"load average {result['load_average']}")
    return 0


def write_result(result: Mapping[str, Any], args: argparse.Namespace) -> Path:
    """<out>/real_model_learning-<recipe>-<engine>-<time>.json; out: --out, else DEFAULT_OUT (outside the repository)."""
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    folder = Path(args.out) if args.out is not None else DEFAULT_OUT
    path = folder / f"real_model_learning-{Path(args.recipe).stem}-{args.engine}-{stamp}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    return path


if __name__ == "__main__":
    sys.exit(main())
