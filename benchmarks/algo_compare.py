"""Learning comparison of the algorithm families on arithmetic_tiny: held-out accuracy after SFT -> RL.

One SFT run (the recipe's 250 steps), then, from that same checkpoint, one RL run per fiddler of
experiments/arithmetic_tiny.py at the same budget (`--steps` steps of `--prompts` prompts x 8
samples; PPO, which samples once per prompt, gets 8x the prompts so it sees as many samples), each
evaluated greedily on the recipe's 500 held-out problems. One seed: differences of a few points are
within run-to-run noise (the recipe's own comment: 45% -> 55% in one run, 42% in an equivalent one).

    nice -n 19 python benchmarks/algo_compare.py                    # ~10-20 min on one core
    python benchmarks/algo_compare.py --families grpo,dapo --steps 10

Writes benchmarks/results/algo_compare-<time>.json and prints a Markdown table (docs/algorithms.md).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from rlhf.cli.experiment import load_experiment

ROOT = Path(__file__).parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from scratch import report_pruned  # noqa: E402  logs stay, checkpoints go

FAMILIES = ["grpo", "ppo", "rloo", "reinforce_pp", "remax", "opo", "gpg", "grpo_passk", "optimal_token_baseline",
            "dapo", "gspo", "sapo", "cispo", "gmpo", "clip_cov", "kl_cov", "rollout_correction", "pf_ppo"]
ACCURACY = "val-core/arithmetic/reward/mean@1"


def graph(recipe, out: Path, family: str | None = None):
    """The recipe's graph with one fiddler applied (None or "grpo": the base), on LocalRuntime,
    untracked and quiet, writing under `out` (also used by vllm_learning.py)."""
    import rlhf_configs.common as common

    g = recipe.base()
    if family not in (None, "grpo"):
        getattr(recipe, family)(g)
    for f in (common.local, common.no_tracking, common.quiet):
        f(g)
    g.output_dir = str(out)
    return g


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--steps", type=int, default=40, help="RL steps per family")
    parser.add_argument("--prompts", type=int, default=16, help="prompts per RL step (x 8 samples)")
    parser.add_argument("--sft-checkpoint", default=None, help="reuse an SFT checkpoint instead of training one")
    args = parser.parse_args()
    torch.set_num_threads(1)

    from rlhf.runtime.experiment import resolve_stage_outputs, run_experiment

    recipe = load_experiment(str(ROOT / "experiments" / "arithmetic_tiny.py"))
    out = Path(tempfile.mkdtemp(prefix="algo_compare-"))
    results: dict[str, dict] = {}
    if args.sft_checkpoint:
        checkpoint = args.sft_checkpoint
    else:
        g = graph(recipe, out / "sft")
        g.stages = {"sft": g.stages["sft"]}
        start = time.perf_counter()
        sft = run_experiment(g)["sft"]
        checkpoint = sft["checkpoint"]
        results["sft"] = {"accuracy": sft["metrics"][ACCURACY], "seconds": time.perf_counter() - start}
        print(f"sft: {results['sft']}", flush=True)
    for family in args.families.split(","):
        g = graph(recipe, out / family, family)
        rl = g.stages["grpo"]
        rl.total_steps = args.steps
        rl.prompts_per_step = args.prompts * (8 // rl.sampling.n)  # the same samples per step for every family
        rl.critic_warmup = min(rl.critic_warmup, args.steps // 8)
        g.stages = {"grpo": resolve_stage_outputs(rl, {"sft": {"checkpoint": checkpoint}}, "grpo")}
        start = time.perf_counter()
        metrics = run_experiment(g)["grpo"]["metrics"]
        results[family] = {"accuracy": metrics[ACCURACY], "seconds": time.perf_counter() - start,
                           "train_score": metrics["critic/score/mean"]}
        print(f"{family}: {results[family]}", flush=True)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    path = ROOT / "benchmarks" / "results" / f"algo_compare-{stamp}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"steps": args.steps, "prompts": args.prompts, "samples_per_step": args.prompts * 8,
                                "seed": 0, "results": results}, indent=2))
    report_pruned(out)
    print(f"\nwrote {path}\n\n| run | held-out accuracy | wall s |\n|---|---|---|")
    for name, r in results.items():
        print(f"| {name} | {100 * r['accuracy']:.1f}% | {r['seconds']:.0f} |")


if __name__ == "__main__":
    main()
