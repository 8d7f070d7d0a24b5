"""Does the tiny model learn to use a calculator? experiments/tool_calculator.py, whole, in this process.

Runs the recipe's four stages on LocalRuntime (Aim runs in a temporary repo, read back for the
curves): SFT on tool-use demonstrations, multi-turn GRPO with the calculator, the held-out
evaluation with the tool, and the no-tool baseline (the same model and SFT budget on bare
answers). Prints and writes benchmarks/results/tool_calculator-<time>.json: held-out greedy accuracy
with the tool after SFT and after GRPO, the baseline's, the GRPO curves (training score, turns, tool
calls and errors, held-out accuracy every 10 steps), wall time per stage and the load average.

    OMP_NUM_THREADS=1 python benchmarks/tool_calculator.py        # ~8-16 min on a shared 2-core machine
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

import rlhf_configs.common as common
from rlhf.cli.experiment import load_experiment
from rlhf.runtime.experiment import run_experiment
from rlhf.tracking.query import metric_values

ROOT = Path(__file__).parents[1]
ACCURACY = "val-core/long_addition/reward/mean@1"
CURVES = ("critic/score/mean", "num_turns/mean", "tool_calls/mean", "tool_errors/total", ACCURACY, "timing_s/step")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grpo-steps", type=int, default=None, help="GRPO steps (default: the recipe's)")
    parser.add_argument("--test-freq", type=int, default=10, help="held-out evaluation every k GRPO steps")
    args = parser.parse_args()
    torch.set_num_threads(1)
    recipe = load_experiment(str(ROOT / "experiments" / "tool_calculator.py"))
    graph = recipe.base()
    common.local(graph)
    common.quiet(graph)
    grpo = graph.stages["grpo"]
    grpo.test_freq = args.test_freq
    if args.grpo_steps is not None:
        grpo.total_steps = args.grpo_steps
    work = Path(tempfile.mkdtemp(prefix="tool_calculator-"))
    graph.output_dir = str(work / "out")
    graph.tracker.repo = str(work / "aim")
    load_before = os.getloadavg()
    started = time.perf_counter()
    results = run_experiment(graph)
    seconds = time.perf_counter() - started
    accuracy = {stage: results[stage]["metrics"].get(ACCURACY) for stage in results}
    report = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "command": "python benchmarks/tool_calculator.py" + "".join(f" {a}" for a in sys.argv[1:]),
        "heldout_accuracy": {
            "with_tool_after_sft": accuracy["sft"],
            "with_tool_after_grpo": accuracy["eval"],
            "no_tool_baseline": accuracy["no_tool_sft"],
        },
        "margin_points": round(100 * (accuracy["eval"] - accuracy["no_tool_sft"]), 1),
        "settings": {"sft_steps": graph.stages["sft"].total_steps, "grpo_steps": grpo.total_steps,
                     "prompts_per_step": grpo.prompts_per_step, "samples_per_prompt": grpo.sampling.n,
                     "heldout_problems": graph.stages["eval"].evaluator.dataset.rows.n},
        "grpo_curves": {name: metric_values(graph.tracker.repo, results["grpo"]["run_hash"], name) for name in CURVES},
        "wall_s": round(seconds, 1),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "torch_threads": torch.get_num_threads(),
    }
    out = ROOT / "benchmarks" / "results" / f"tool_calculator-{datetime.datetime.now():%Y%m%d-%H%M%S}.json"
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({k: report[k] for k in ("heldout_accuracy", "margin_points", "wall_s", "load_average_after")}))
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
