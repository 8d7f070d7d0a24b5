"""Synchronous vs one-step-off vs streaming rollout, side by side: steps/s, trainer idle, held-out accuracy.

Two jobs, each run in every mode through Ray with the same seed, data and number of samples:

- `tiny`: the main job's GRPO stage (experiments/arithmetic_tiny.py: 64 prompts x 8 samples a step) from
  one SFT checkpoint of the recipe, on a 2-CPU Ray cluster: in the asynchronous modes the rollout group
  has one core and the policy (trainer) the other; synchronously the policy group generates and trains.
- `smollm2`: the same stage on SmolLM2-135M-Instruct (no SFT; reward: the last number of the response,
  verl's flexible GSM8K rule, so the model's "18 + 93 = 111" scores), fewer and smaller steps.

Modes: `sync` (the default: the policy group's hybrid engine), `one_step_off` (fiddler:one_step_off) and
`streaming` (fiddler:streaming, max_staleness=2, waiting past the bound); `sync_separate` (a rollout group
at max_staleness=0: two workers, no overlap) shows what the overlap itself buys. Timing rounds alternate the
modes (`--rounds`); ratios to sync are per round, reported as median and range. Steps/s is over steps
2..N (step 1 carries the start-up); the trainer idle fraction is the time the trainer waited for a batch
(`async/trainer_idle_s`; synchronously, the generation and scoring time) over the step time. Accuracy is
greedy on held-out problems after the run (the same number of trained samples in every mode; nothing is
dropped when waiting).

    flock /work/locks/bench python benchmarks/async_rollout.py --jobs tiny        # ~15 min on a shared 2-core box
    python benchmarks/async_rollout.py --jobs smollm2 --rounds 1                 # the real model: ~20 min
    python benchmarks/async_rollout.py --gpu --runtime local --placement colocated   # one GPU, no Ray (docs/async.md)

Writes benchmarks/results/async_rollout-<time>.json and prints a Markdown table (docs/async.md).
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import fiddle as fdl
import torch

ROOT = Path(__file__).parents[1]
sys.path.insert(0, str(ROOT))

from rlhf.cli.experiment import load_experiment  # noqa: E402

MODES = ["sync", "one_step_off", "streaming"]
ACCURACY = "val-core/arithmetic/reward/mean@1"


def apply_mode(g, mode: str, placement: str) -> None:
    from fiddle import selectors

    from rlhf.trainers.rl import RLTrainer
    from rlhf_configs.async_rollout import use_async_rollout

    settings = {"one_step_off": dict(max_staleness=1, weights="fixed_lag"),  # = fiddler:one_step_off
                "streaming": dict(max_staleness=2, weights="newest"),  # = fiddler:streaming
                "sync_separate": dict(max_staleness=0, weights="fixed_lag")}
    if mode == "sync":
        return
    if mode not in settings:
        raise SystemExit(f"unknown mode {mode!r}; modes: sync, {', '.join(settings)}")
    for stage in selectors.select(g, RLTrainer):
        use_async_rollout(stage, placement=placement, **settings[mode])


def tiny_graph(recipe, out: Path, steps: int, prompts: int, checkpoint: str, args):
    import rlhf_configs.common as common
    from rlhf.runtime.experiment import resolve_stage_outputs
    from rlhf.runtime.ray_runtime import RayRuntime

    g = recipe.base()
    common.no_tracking(g)
    common.quiet(g)
    g.output_dir = str(out)
    rl = g.stages["grpo"]
    rl.total_steps, rl.prompts_per_step = steps, prompts
    g.stages = {"grpo": resolve_stage_outputs(rl, {"sft": {"checkpoint": checkpoint}}, "grpo")}
    if args.runtime == "local":
        common.local(g)
    else:
        g.runtime = fdl.Config(RayRuntime, num_cpus=None if args.gpu else 2)
    if args.gpu:
        g.stages["grpo"].policy.gpus_per_worker = 1
    return g


def smollm2_graph(recipe, out: Path, steps: int, prompts: int, model: str, eval_problems: int, args):
    """The recipe's GRPO stage on SmolLM2 (no SFT, flexible last-number reward, 4 samples of 24 tokens)."""
    from rlhf.models.loading import load_tokenizer
    from rlhf.rewards.gsm8k import gsm8k_score
    from rlhf.rewards.manager import RewardManager

    g = tiny_graph(recipe, out, steps, prompts, model, args)
    rl = g.stages["grpo"]
    tokenizer = fdl.Config(load_tokenizer, model)
    reward = fdl.Config(RewardManager, scorers={"arithmetic": fdl.Partial(gsm8k_score, method="flexible")})
    rl.policy.worker.model_path = rl.policy.worker.ref_model_path = model
    rl.policy.worker.optimizer.lr = 1e-6
    rl.tokenizer = rl.train_data.tokenizer = tokenizer
    rl.reward = reward
    rl.sampling.n, rl.sampling.max_new_tokens = 4, 24
    rl.policy.worker.training.micro_batch_size = 16
    rl.evaluator.dataset.tokenizer = tokenizer
    rl.evaluator.dataset.rows.n = eval_problems
    rl.evaluator.reward = reward
    rl.evaluator.sampling.max_new_tokens = 24
    return g


def run_mode(g, mode: str, placement: str) -> dict:
    """Run the graph in `mode`; per-step metrics, wall clock of each step's end, the final metrics."""
    from rlhf.runtime.experiment import run_experiment
    from rlhf.trainers.rl import RLTrainer

    apply_mode(g, mode, placement)
    steps: list[dict] = []
    ends: list[float] = []
    original = RLTrainer.step

    @functools.wraps(original)
    def recording(self, rollouts, needs, n):
        metrics, batch = original(self, rollouts, needs, n)
        steps.append(dict(metrics))
        ends.append(time.perf_counter())
        return metrics, batch

    RLTrainer.step = recording
    try:
        start = time.perf_counter()
        final = run_experiment(g)["grpo"]["metrics"]
        wall = time.perf_counter() - start
    finally:
        RLTrainer.step = original
    return summarise(mode, steps, ends, final, wall)


def summarise(mode: str, steps: list[dict], ends: list[float], final: dict, wall: float) -> dict:
    steady = steps[1:]
    seconds = ends[-1] - ends[0]
    step_time = sum(m["timing_s/step"] for m in steady)
    if mode == "sync":
        idle = sum(m.get("timing_s/gen", 0.0) + m.get("timing_s/reward", 0.0) for m in steady)
    else:
        idle = sum(m["async/trainer_idle_s"] for m in steady)
    mean = lambda key: statistics.fmean(m.get(key, 0.0) for m in steady)  # noqa: E731
    return {
        "steps_per_s": len(steady) / seconds,
        "trainer_idle_fraction": idle / step_time,
        "accuracy": final.get(ACCURACY),
        "wall_s": wall,
        "gen_s": mean("timing_s/gen"),
        "reward_s": mean("timing_s/reward"),
        "update_s": mean("timing_s/update_actor"),
        "old_log_prob_s": mean("timing_s/old_log_prob"),
        "publish_s": mean("timing_s/publish"),
        "step_s": mean("timing_s/step"),
        "staleness_mean": mean("async/staleness/mean"),
        "staleness_max": max((m.get("async/staleness/max", 0.0) for m in steps), default=0.0),
        "weight_sync_s": mean("async/weight_sync_s"),
        "rollout_idle_s": mean("async/rollout_idle_s"),
        "train_score_last": steps[-1].get("critic/score/mean"),
        "steps": len(steps),
    }


def sft_checkpoint(recipe, out: Path, steps: int) -> tuple[str, float]:
    import rlhf_configs.common as common
    from rlhf.runtime.experiment import run_experiment

    g = recipe.base()
    for f in (common.local, common.no_tracking, common.quiet):
        f(g)
    g.output_dir = str(out)
    g.stages = {"sft": g.stages["sft"]}
    g.stages["sft"].total_steps = steps
    result = run_experiment(g)["sft"]
    return result["checkpoint"], result["metrics"][ACCURACY]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", default="tiny,smollm2", help="tiny, smollm2 (comma-separated)")
    parser.add_argument("--modes", default=",".join(MODES), help="sync, one_step_off, streaming, sync_separate")
    parser.add_argument("--rounds", type=int, default=3, help="alternations of the modes (timing spread)")
    parser.add_argument("--steps", type=int, default=60, help="GRPO steps of the tiny job per run")
    parser.add_argument("--prompts", type=int, default=64, help="prompts per step of the tiny job (x 8 samples)")
    parser.add_argument("--sft-steps", type=int, default=250, help="SFT steps of the tiny job (the recipe's 250)")
    parser.add_argument("--sft-checkpoint", default=None, help="reuse an SFT checkpoint of the tiny job")
    parser.add_argument("--smol-steps", type=int, default=6, help="GRPO steps on SmolLM2 per run")
    parser.add_argument("--smol-prompts", type=int, default=8, help="prompts per SmolLM2 step (x 4 samples)")
    parser.add_argument("--smol-eval", type=int, default=64, help="held-out problems for SmolLM2's accuracy")
    parser.add_argument("--smol-rounds", type=int, default=1, help="alternations on SmolLM2 (each run is minutes)")
    parser.add_argument("--gpu", action="store_true", help="one GPU per worker group (a GPU machine)")
    parser.add_argument("--runtime", default="ray", choices=["ray", "local"],
                        help="local: every group in this process (a machine without Ray: the asynchronous groups "
                             "must then be colocated)")
    parser.add_argument("--placement", default="separate", choices=["separate", "colocated"],
                        help="the rollout group's placement in the asynchronous modes")
    args = parser.parse_args()
    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")

    recipe = load_experiment(str(ROOT / "experiments" / "arithmetic_tiny.py"))
    modes = args.modes.split(",")
    out = Path(tempfile.mkdtemp(prefix="async_rollout-"))
    report: dict = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "modes": modes,
                    "load_average_start": os.getloadavg(), "cpus": os.cpu_count(), "gpu": args.gpu,
                    "runtime": args.runtime, "placement": args.placement, "jobs": {}}
    for job in args.jobs.split(","):
        if job == "tiny":
            if args.sft_checkpoint:
                checkpoint, sft_accuracy = args.sft_checkpoint, None
            else:
                checkpoint, sft_accuracy = sft_checkpoint(recipe, out / "sft", args.sft_steps)
                print(f"tiny: SFT checkpoint {checkpoint} (held-out accuracy {sft_accuracy:.3f})", flush=True)
            make = lambda o: tiny_graph(recipe, o, args.steps, args.prompts, checkpoint, args)  # noqa: E731
            rounds, settings = args.rounds, {"steps": args.steps, "prompts": args.prompts, "samples_per_prompt": 8,
                                             "sft_accuracy": sft_accuracy, "sft_steps": args.sft_steps}
        elif job == "smollm2":
            from rlhf.models.importing import import_model

            model = str(import_model("smollm2-135m-instruct"))
            make = lambda o: smollm2_graph(recipe, o, args.smol_steps, args.smol_prompts, model,  # noqa: E731
                                           args.smol_eval, args)
            rounds, settings = args.smol_rounds, {"steps": args.smol_steps, "prompts": args.smol_prompts,
                                                  "samples_per_prompt": 4, "eval_problems": args.smol_eval}
        else:
            raise SystemExit(f"unknown job {job!r}: tiny or smollm2")
        runs: dict[str, list[dict]] = {m: [] for m in modes}
        for r in range(rounds):
            for mode in modes[r % len(modes):] + modes[: r % len(modes)]:  # rotate the order every round
                result = run_mode(make(out / job / f"{mode}-{r}"), mode, args.placement)
                result["load_average"] = os.getloadavg()
                runs[mode].append(result)
                print(f"{job} round {r} {mode}: " + ", ".join(
                    f"{k} {v:.3g}" for k, v in result.items() if isinstance(v, float)), flush=True)
        report["jobs"][job] = {"settings": settings, "runs": runs, "summary": summary(runs, modes)}
    report["load_average_end"] = os.getloadavg()
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    path = ROOT / "benchmarks" / "results" / f"async_rollout-{stamp}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2))
    print(f"\nwrote {path}\n")
    print(table(report))
    return 0


def summary(runs: dict[str, list[dict]], modes: list[str]) -> dict:
    """Per mode: medians over rounds, and the speed-up over sync per round (median, min, max)."""
    out = {}
    for mode in modes:
        rs = runs[mode]
        entry = {k: statistics.median(r[k] for r in rs) for k in ("steps_per_s", "trainer_idle_fraction", "gen_s",
                                                                   "update_s", "old_log_prob_s", "staleness_mean")}
        entry["accuracy"] = [r["accuracy"] for r in rs]
        if "sync" in runs and mode != "sync":
            ratios = [r["steps_per_s"] / s["steps_per_s"] for r, s in zip(rs, runs["sync"])]
            entry["speedup_vs_sync"] = {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}
            entry["accuracy_points_vs_sync"] = [100 * (r["accuracy"] - s["accuracy"]) for r, s in zip(rs, runs["sync"])]
        out[mode] = entry
    return out


def table(report: dict) -> str:
    lines = ["| job | mode | steps/s | x sync (median, range) | trainer idle | staleness | held-out accuracy | gen s | update s |",
             "|---|---|---|---|---|---|---|---|---|"]
    for job, data in report["jobs"].items():
        for mode, s in data["summary"].items():
            speed = s.get("speedup_vs_sync")
            ratio = f"{speed['median']:.2f}x ({speed['min']:.2f}-{speed['max']:.2f})" if speed else "1"
            acc = ", ".join(f"{100 * a:.1f}%" for a in s["accuracy"] if a is not None)
            lines.append(f"| {job} | {mode} | {s['steps_per_s']:.3f} | {ratio} | {100 * s['trainer_idle_fraction']:.0f}% | "
                         f"{s['staleness_mean']:.2f} | {acc} | {s['gen_s']:.2f} | {s['update_s']:.2f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
