"""Does SmolLM2-135M-Instruct learn to use a Python tool? experiments/smollm2_python_tool.py, whole, in this process.

Runs the recipe's two stages on LocalRuntime (Aim in a temporary repo, read back for the curves): a
short SFT on code-block demonstrations (with the held-out evaluation before and after it), then
multi-turn GRPO with the sandboxed `python` tool, evaluated at its end. Prints and writes
benchmarks/results/smollm2_python_tool-<time>.json: held-out greedy accuracy with the tool for the
untuned model, after SFT and after GRPO, tool calls per conversation at each point, the GRPO curves,
wall time and the load average. Loads the real model (~5 GB).

    OMP_NUM_THREADS=1 python benchmarks/smollm2_python_tool.py   # 11-30 min on 1 thread, by load
    # GRPO's own gain: a partial warm start (59% held-out), then GRPO to 100% (docs/agents.md)
    OMP_NUM_THREADS=1 python benchmarks/smollm2_python_tool.py --no-untuned --sft-steps 1 --sft-lr 4e-5 \
        --heldout 64 --grpo-steps 6 --grpo-lr 2e-5 --grpo-temperature 0.7
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
sys.path.insert(0, str(ROOT / "benchmarks"))
from scratch import report_pruned  # noqa: E402  logs stay, checkpoints go
ACCURACY = "val-core/long_addition/reward/mean@1"
EVAL_CURVES = (ACCURACY, "val-aux/tool_calls/mean", "val-aux/num_turns/mean")
GRPO_CURVES = ("critic/score/mean", "num_turns/mean", "tool_calls/mean", "tool_errors/total", "timing_s/step")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sft-steps", type=int, default=None, help="SFT steps (default: the recipe's)")
    parser.add_argument("--sft-lr", type=float, default=None, help="SFT learning rate (default: the recipe's)")
    parser.add_argument("--grpo-steps", type=int, default=None, help="GRPO steps (default: the recipe's)")
    parser.add_argument("--grpo-lr", type=float, default=None, help="GRPO learning rate (default: the recipe's)")
    parser.add_argument("--grpo-temperature", type=float, default=None,
                        help="GRPO's sampling temperature (default: the recipe's)")
    parser.add_argument("--grpo-seed", type=int, default=None,
                        help="GRPO's seed: prompt order and sampling (default: the recipe's)")
    parser.add_argument("--samples-per-prompt", type=int, default=None, help="GRPO group size (default: the recipe's)")
    parser.add_argument("--heldout", type=int, default=None, help="held-out problems (default: the recipe's)")
    parser.add_argument("--no-untuned", action="store_true", help="skip the untuned model's evaluation (0%%: see the "
                        "recipe's docstring) to save its minutes")
    parser.add_argument("--sft-only", action="store_true",
                        help="only the warm start and its held-out accuracy (no untuned evaluation, no GRPO): "
                             "to pick a warm start quickly")
    args = parser.parse_args()
    torch.set_num_threads(1)
    recipe = load_experiment(str(ROOT / "experiments" / "smollm2_python_tool.py"))
    graph = recipe.base()
    common.local(graph)
    common.quiet(graph)
    sft, grpo = graph.stages["sft"], graph.stages["grpo"]
    sft.val_before_train = not (args.sft_only or args.no_untuned)  # the untuned model's accuracy, logged at step 0
    if args.sft_steps is not None:
        sft.total_steps = args.sft_steps
    if args.sft_lr is not None:
        sft.policy.worker.optimizer.lr = args.sft_lr
    if args.grpo_steps is not None:
        grpo.total_steps = args.grpo_steps
    if args.grpo_lr is not None:
        grpo.policy.worker.optimizer.lr = args.grpo_lr
    if args.grpo_temperature is not None:
        grpo.sampling.temperature = args.grpo_temperature
    if args.samples_per_prompt is not None:
        grpo.sampling.n = args.samples_per_prompt
    if args.grpo_seed is not None:
        grpo.seed = args.grpo_seed
    if args.heldout is not None:
        sft.evaluator.dataset.rows.n = grpo.evaluator.dataset.rows.n = args.heldout
    work = Path(tempfile.mkdtemp(prefix="smollm2_python_tool-"))
    graph.output_dir = str(work / "out")
    graph.tracker.repo = str(work / "aim")
    load_before = os.getloadavg()
    started = time.perf_counter()
    results = run_experiment(graph, stages=["sft"] if args.sft_only else None)
    seconds = time.perf_counter() - started
    repo = graph.tracker.repo
    curves = {stage: {name: metric_values(repo, results[stage]["run_hash"], name) for name in EVAL_CURVES}
              for stage in results}

    def at(stage: str, name: str, step: int | None) -> float | None:
        values = dict(curves.get(stage, {}).get(name, []))
        return values.get(step if step is not None else max(values, default=None))

    report = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "command": "python benchmarks/smollm2_python_tool.py" + "".join(f" {a}" for a in sys.argv[1:]),
        "heldout_accuracy_with_tool": {"untuned": at("sft", ACCURACY, 0), "after_sft": at("sft", ACCURACY, None),
                                       "after_grpo": at("grpo", ACCURACY, None)},
        "heldout_tool_calls_per_conversation": {
            "untuned": at("sft", EVAL_CURVES[1], 0), "after_sft": at("sft", EVAL_CURVES[1], None),
            "after_grpo": at("grpo", EVAL_CURVES[1], None)},
        "settings": {"sft_only": args.sft_only, "sft_steps": sft.total_steps, "sft_lr": sft.policy.worker.optimizer.lr,
                     "sft_batch_size": sft.batch_size, "sft_demonstrations": sft.data.rows.rows.n,
                     "grpo_steps": grpo.total_steps, "grpo_lr": grpo.policy.worker.optimizer.lr,
                     "grpo_temperature": grpo.sampling.temperature, "grpo_seed": grpo.seed,
                     "prompts_per_step": grpo.prompts_per_step,
                     "samples_per_prompt": grpo.sampling.n,
                     "heldout_problems": grpo.evaluator.dataset.rows.n},
        "eval_curves": curves,
        "grpo_curves": {name: metric_values(repo, results["grpo"]["run_hash"], name) for name in GRPO_CURVES}
        if "grpo" in results else {},
        "wall_s": round(seconds, 1),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "torch_threads": torch.get_num_threads(),
    }
    out = ROOT / "benchmarks" / "results" / f"smollm2_python_tool-{datetime.datetime.now():%Y%m%d-%H%M%S}.json"
    out.write_text(json.dumps(report, indent=1) + "\n")
    report_pruned(work)
    print(json.dumps({k: report[k] for k in ("heldout_accuracy_with_tool", "heldout_tool_calls_per_conversation",
                                             "wall_s", "load_average_after")}))
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
