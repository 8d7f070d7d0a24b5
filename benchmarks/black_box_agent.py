"""Does RL through a black-box agent program teach SmolLM2 to use its calculator? experiments/smollm2_agent.py, whole.

Runs the recipe on LocalRuntime in this process (Aim in a temporary repo, read back for the curves): the
agent (plain `openai` code calling a `multiply` function with `tools=`) evaluated greedily on the untuned
model, a short SFT warm start on the agent's own tool use, then GRPO on the agent's attempts through the
agent-program loop, evaluated greedily through the same loop. Prints and writes
benchmarks/results/black_box_agent-<time>.json with top level `base_accuracy` (untuned), `warm_start_accuracy`
(after SFT), `trained_accuracy` (after GRPO), `gain_over_warm_start` and `gain_over_base` (points), the
held-out curve by GRPO step, the training curves, wall time and the load average. Loads the real model.

    OMP_NUM_THREADS=1 python benchmarks/black_box_agent.py            # ~15-20 min on one thread
    OMP_NUM_THREADS=1 python benchmarks/black_box_agent.py --quick    # the whole path in ~3 min: 8 tasks, 1 step
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
ACCURACY = "val-core/long_multiplication/reward/mean@1"
EVAL_CURVES = (ACCURACY, "val-aux/tool_calls/mean", "val-aux/num_turns/mean", "val-aux/agent/errors/total")
GRPO_CURVES = ("critic/score/mean", "agent/reward/mean", "num_turns/mean", "tool_calls/mean", "agent/errors/total",
               "agent/timeouts", "agent/generate_calls", "agent/rows_per_call/mean", "timing_s/gen", "timing_s/step")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the recipe's smoke: 8 held-out tasks, 1 GRPO step")
    parser.add_argument("--sft-steps", type=int, default=None, help="warm-start SFT steps (default: the recipe's)")
    parser.add_argument("--sft-lr", type=float, default=None, help="warm-start learning rate (default: the recipe's)")
    parser.add_argument("--grpo-steps", type=int, default=None, help="GRPO steps (default: the recipe's)")
    parser.add_argument("--grpo-lr", type=float, default=None, help="GRPO learning rate (default: the recipe's)")
    parser.add_argument("--temperature", type=float, default=None, help="GRPO's sampling temperature")
    parser.add_argument("--prompts-per-step", type=int, default=None, help="tasks per GRPO step")
    parser.add_argument("--attempts", type=int, default=None, help="attempts per task (the GRPO group)")
    parser.add_argument("--test-freq", type=int, default=None, help="held-out evaluation every k GRPO steps")
    parser.add_argument("--heldout", type=int, default=None, help="held-out tasks (default: the recipe's 64)")
    parser.add_argument("--seed", type=int, default=None, help="GRPO's seed: task order and sampling")
    parser.add_argument("--transport", choices=["in_process", "loopback"], default=None,
                        help="the agents' way to the gateway (default: the recipe's, in-process)")
    parser.add_argument("--sft-only", action="store_true", help="only the warm start and its two evaluations")
    args = parser.parse_args()
    torch.set_num_threads(1)
    recipe = load_experiment(str(ROOT / "experiments" / "smollm2_agent.py"))
    graph = recipe.base()
    if args.quick:
        recipe.smoke(graph)
    common.local(graph)
    common.quiet(graph)
    sft, grpo = graph.stages["sft"], graph.stages["grpo"]
    for value, assign in (
        (args.sft_steps, lambda v: setattr(sft, "total_steps", v)),
        (args.sft_lr, lambda v: setattr(sft.policy.worker.optimizer, "lr", v)),
        (args.grpo_steps, lambda v: setattr(grpo, "total_steps", v)),
        (args.grpo_lr, lambda v: setattr(grpo.policy.worker.optimizer, "lr", v)),
        (args.temperature, lambda v: setattr(grpo.sampling, "temperature", v)),
        (args.prompts_per_step, lambda v: setattr(grpo, "prompts_per_step", v)),
        (args.attempts, lambda v: setattr(grpo.sampling, "n", v)),
        (args.test_freq, lambda v: setattr(grpo, "test_freq", v)),
        (args.seed, lambda v: setattr(grpo, "seed", v)),
    ):
        if value is not None:
            assign(value)
    for stage in (sft, grpo):
        if args.heldout is not None:
            stage.evaluator.dataset.rows.n = args.heldout
        if args.transport is not None:
            stage.evaluator.rollout.transport = args.transport
    if args.transport is not None:
        grpo.rollout.transport = args.transport
    work = Path(tempfile.mkdtemp(prefix="black_box_agent-"))
    graph.output_dir = str(work / "out")
    graph.tracker.repo = str(work / "aim")
    load_before = os.getloadavg()
    started = time.perf_counter()
    results = run_experiment(graph, stages=["sft"] if args.sft_only else None)
    seconds = time.perf_counter() - started
    repo = graph.tracker.repo
    curves = {stage: {name: metric_values(repo, results[stage]["run_hash"], name) for name in EVAL_CURVES}
              for stage in results}

    def at(stage: str, step: int | None, name: str = ACCURACY) -> float | None:
        values = dict(curves.get(stage, {}).get(name, []))
        return values.get(step if step is not None else max(values, default=None))

    base, warm, trained = at("sft", 0), at("sft", None), at("grpo", None)
    points = lambda a, b: None if a is None or b is None else round(100 * (a - b), 1)  # noqa: E731
    report = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "command": "python benchmarks/black_box_agent.py" + "".join(f" {a}" for a in sys.argv[1:]),
        "base_accuracy": base,
        "warm_start_accuracy": warm,
        "trained_accuracy": trained,
        "gain_over_warm_start": points(trained, warm),
        "gain_over_base": points(trained, base),
        "heldout_tasks": grpo.evaluator.dataset.rows.n,
        "curve": {"heldout_accuracy_by_grpo_step": [[0, warm]] + [list(p) for p in curves.get("grpo", {}).get(ACCURACY, [])],
                  **({name: metric_values(repo, results["grpo"]["run_hash"], name) for name in GRPO_CURVES}
                     if "grpo" in results else {})},
        "eval_curves": curves,
        "warm_start": {"sft_steps": sft.total_steps, "sft_lr": sft.policy.worker.optimizer.lr,
                       "sft_batch_size": sft.batch_size, "demonstrations": "the agent's own tool use, "
                       "rendered with its tools (rlhf.agents.tool_demonstrations(tool_schemas=TOOLS))"},
        "settings": {"grpo_steps": grpo.total_steps, "grpo_lr": grpo.policy.worker.optimizer.lr,
                     "temperature": grpo.sampling.temperature, "prompts_per_step": grpo.prompts_per_step,
                     "attempts_per_task": grpo.sampling.n, "max_new_tokens_per_completion": grpo.sampling.max_new_tokens,
                     "seed": grpo.seed, "transport": grpo.rollout.transport, "quick": args.quick},
        "wall_s": round(seconds, 1),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "torch_threads": torch.get_num_threads(),
    }
    out = ROOT / "benchmarks" / "results" / f"black_box_agent-{datetime.datetime.now():%Y%m%d-%H%M%S}.json"
    out.write_text(json.dumps(report, indent=1) + "\n")
    report_pruned(work)
    print(json.dumps({k: report[k] for k in ("base_accuracy", "warm_start_accuracy", "trained_accuracy",
                                             "gain_over_warm_start", "gain_over_base", "wall_s", "load_average_after")}))
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
