"""Does RL make a real pretrained model better? experiments/smollm2_arithmetic.py, base vs trained.

Runs the recipe as it is (LocalRuntime, no Aim), with held-out validation every `--test-freq`
steps, and reports greedy held-out accuracy on the recipe's 200 problems before and after:
exact match (the whole answer is the number: the recipe's target) and, beside it, the lenient
rule (the answer's last number is right). The curve holds every validation and every step's
mean training reward.

    OMP_NUM_THREADS=1 python benchmarks/real_model_learning.py    # CPU, fp32
    VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CPU_KVCACHE_SPACE=1 OMP_NUM_THREADS=1 \\
        .venv-vllm/bin/python benchmarks/real_model_learning.py --engine vllm            # the same graph on vllm-cpu

Writes benchmarks/results/real_model_learning-<engine>-<time>.json with top-level `base_accuracy`
and `trained_accuracy` (fractions, exact match), the lenient ones, the curve, the settings, the
wall time and the load average.
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
from collections.abc import Mapping
from pathlib import Path

import fiddle as fdl
import torch

ROOT = Path(__file__).resolve().parents[1]
EXACT = "val-core/arithmetic/reward/mean@1"
LENIENT = "val-aux/arithmetic/last_number/mean@1"
KEPT = ("critic/score/mean", "response_length/mean", "timing_s/gen", "timing_s/update_actor", "timing_s/step",
        "actor/entropy", EXACT, LENIENT)


class CurveTracker:
    """A tracker that keeps every logged step's headline metrics in memory (and prints them)."""

    curve: list[dict] = []  # class-level: the runner builds its own instance from the graph
    start = time.perf_counter()

    def start_run(self, stage: str, **lineage) -> CurveTracker:  # lineage: name, params, parent_run, tags
        return self

    hash = None

    def track(self, metrics: Mapping[str, float], step: int) -> None:
        point = {"step": step, "wall_s": round(time.perf_counter() - CurveTracker.start, 1)}
        point.update({k: round(float(metrics[k]), 4) for k in KEPT if k in metrics})
        CurveTracker.curve.append(point)
        print(json.dumps(point), flush=True)

    def set_params(self, params: Mapping) -> None:
        pass

    def __enter__(self) -> CurveTracker:
        return self

    def __exit__(self, *exc) -> bool:
        return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=["transformers", "vllm"], default="transformers")
    parser.add_argument("--test-freq", type=int, default=0, help="validate every k steps (0: before and after only)")
    parser.add_argument("--config", action="append", default=[], metavar="CMD",
                        help="more overrides of the recipe (e.g. 'config:base(steps=32)', set:stages.grpo.test_freq=4)")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = parser.parse_args()
    torch.set_num_threads(1)

    from rlhf.cli.experiment import build_graph, load_experiment
    from rlhf.graph.io import flatten
    from rlhf.runtime.experiment import run_experiment

    recipe = load_experiment(str(ROOT / "experiments" / "smollm2_arithmetic.py"))
    configs = [c for c in args.config if c.startswith("config:")]  # a config: command builds the graph: first
    commands = [*configs, "fiddler:local", "fiddler:quiet", *(["fiddler:vllm"] if args.engine == "vllm" else []),
                f"set:stages.grpo.test_freq={args.test_freq}", *(c for c in args.config if c not in configs)]
    graph, _ = build_graph(recipe, commands)
    graph.tracker = fdl.Config(CurveTracker)
    graph.output_dir = tempfile.mkdtemp(prefix="real_model_learning-")
    load_before = os.getloadavg()
    CurveTracker.start = start = time.perf_counter()
    metrics = run_experiment(graph)["grpo"]["metrics"]
    wall = time.perf_counter() - start
    validations = [p for p in CurveTracker.curve if EXACT in p]
    stage = graph.stages["grpo"]
    result = {
        "base_accuracy": validations[0][EXACT],
        "trained_accuracy": metrics[EXACT],
        "base_last_number_accuracy": validations[0][LENIENT],
        "trained_last_number_accuracy": metrics[LENIENT],
        "accuracy": "greedy exact match on held-out problems: the whole answer is the number",
        "last_number_accuracy": "greedy, the last number in the answer is the sum",
        "heldout_problems": stage.evaluator.dataset.rows.rows.n,
        "engine": args.engine,
        "wall_s": round(wall, 1),
        "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),  # LocalRuntime: one process
        "train_steps_s": round(sum(p.get("timing_s/step", 0.0) for p in CurveTracker.curve), 1),  # without validation
        "load_average": {"before": [round(x, 2) for x in load_before], "after": [round(x, 2) for x in os.getloadavg()]},
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, 1 thread",
        "command": " ".join([f"{Path(sys.executable).parents[1].name}/bin/python", *sys.argv]),  # .venv or .venv-vllm
        "overrides": commands,
        "settings": flatten(stage),  # the whole stage graph, every default included
        "curve": CurveTracker.curve,
    }
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    path = Path(args.out) / f"real_model_learning-{args.engine}-{stamp}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {path}\n")
    print(f"held-out exact match  {100 * result['base_accuracy']:.1f}% -> {100 * result['trained_accuracy']:.1f}%")
    print(f"held-out last number  {100 * result['base_last_number_accuracy']:.1f}% -> "
          f"{100 * result['trained_last_number_accuracy']:.1f}%")
    print(f"wall {wall / 60:.1f} min ({args.engine}), peak RSS {result['peak_rss_gib']} GiB, "
          f"load average {result['load_average']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
