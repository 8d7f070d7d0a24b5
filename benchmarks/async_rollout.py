"""Synchronous vs one-step-off vs streaming rollout, side by side: steps/s, trainer idle, held-out accuracy.

Two jobs, each run in every mode with the same seed, data and number of trained samples:

- `tiny`: the main job's GRPO stage (experiments/arithmetic_tiny.py: 64 prompts x 8 samples a step, KL
  loss, PPO clip) from one SFT checkpoint of the recipe, through Ray on 2 CPUs: in the asynchronous
  modes the rollout group has one core and the policy (the trainer) the other; synchronously the policy
  group generates and trains on its core.
- `smollm2`: the same GRPO settings on SmolLM2-135M-Instruct (no SFT; reward: the response's last number,
  verl's flexible GSM8K rule, which the model's "18 + 93 = 111" meets), 4 samples of up to 24 tokens.
- `tiny_balanced`: the tiny job decoding through transformers' own `generate` (`HFEngine(use_generate=True)`,
  2-4x slower than the project's decoding loop), so generation takes about as long as the update, the case
  where overlap pays most (on GPUs decoding usually dominates). On this CPU the main job's update costs ~4x
  its generation whatever the response length (forcing 24-token responses: 0.16 s vs 0.45 s).

Modes: `sync` (the default: the policy group's hybrid engine), `one_step_off` (what fiddler:one_step_off
sets) and `streaming` (fiddler:streaming: newest weights, max_staleness=2, waiting past the bound);
`sync_separate` (a rollout group at max_staleness=0: two workers, no overlap) shows what the overlap
itself buys, `sync_reseeded` (sync with another sampling seed) the run-to-run spread of the accuracy that
any difference between modes must be read against, and `two_steps_off` / `four_steps_off` (exactly 2 / 4
versions behind) the staleness/correctness trade-off, with the loss's correction chosen by `--correction`
("bypass": PPO's ratio against the behaviour policy, the fiddlers' default; "decoupled": AReaL's objective). Rounds alternate the modes (`--rounds`); speed-ups are per round, reported as median and
range. Steps/s is over steps 2..N (step 1 carries the start-up). The trainer idle fraction is the time the
trainer waited for its batch (`async/trainer_idle_s`; synchronously the generation and scoring time)
over the step time. Accuracy: greedy, held-out problems, after the run (nothing is dropped when waiting,
so every mode trained on the same number of samples).

    python benchmarks/async_rollout.py                 # both jobs (the real-model
                                                                              # part needs ~6 GB)
    python benchmarks/async_rollout.py --jobs tiny --steps 250 --rounds 2
    python benchmarks/async_rollout.py --jobs smollm2 --gpu --runtime local --placement colocated  # 1 GPU, no Ray

`--runtime local` runs every group in this process without Ray (and without the preflight, which imports
Ray): the GPU recipe for a single lent GPU, where the asynchronous groups must be colocated (time-sliced).
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
sys.path.insert(0, str(ROOT / "benchmarks"))
from scratch import report_pruned  # noqa: E402  logs stay, checkpoints go

MODES = ["sync", "sync_reseeded", "one_step_off", "streaming"]
ASYNC = {"one_step_off": dict(max_staleness=1, weights="fixed_lag"),  # = fiddler:one_step_off
         "streaming": dict(max_staleness=2, weights="newest"),  # = fiddler:streaming
         "sync_separate": dict(max_staleness=0, weights="fixed_lag"),
         "two_steps_off": dict(max_staleness=2, weights="fixed_lag"),  # staleness sweeps: exactly 2 / 4 behind
         "four_steps_off": dict(max_staleness=4, weights="fixed_lag")}
ACCURACY = "val-core/arithmetic/reward/mean@1"


# ------------------------------------------------------------------------------------------ graphs
def tiny_stage(checkpoint: str, steps: int, prompts: int):
    """The recipe's GRPO stage, starting from `checkpoint`."""
    from rlhf.cli.experiment import load_experiment
    from rlhf.runtime.experiment import resolve_stage_outputs

    recipe = load_experiment(str(ROOT / "experiments" / "arithmetic_tiny.py"))
    rl = recipe.base().stages["grpo"]
    rl.total_steps, rl.prompts_per_step = steps, prompts
    return resolve_stage_outputs(rl, {"sft": {"checkpoint": checkpoint}}, "grpo")


def slow_decoding(stage):
    """Decode with transformers' `generate` (the policy's engine; the rollout group takes the same)."""
    from rlhf.rollout.hf_engine import HFEngine

    stage.policy.worker.engine = fdl.Partial(HFEngine, use_generate=True)
    return stage


def tiny_sft(out: Path, steps: int) -> tuple[str, float]:
    """The recipe's SFT stage (in-process): its checkpoint and held-out accuracy."""
    import rlhf_configs.common as common
    from rlhf.cli.experiment import load_experiment
    from rlhf.runtime.experiment import run_experiment

    g = load_experiment(str(ROOT / "experiments" / "arithmetic_tiny.py")).base()
    for f in (common.local, common.no_tracking, common.quiet):
        f(g)
    g.output_dir = str(out)
    g.stages = {"sft": g.stages["sft"]}
    g.stages["sft"].total_steps = steps
    result = run_experiment(g)["sft"]
    return result["checkpoint"], result["metrics"][ACCURACY]


def smollm2_stage(model: str, steps: int, prompts: int, eval_problems: int, gpu: bool):
    """The main job's GRPO settings on SmolLM2 (no recipe module: it imports Ray, which a lent GPU lacks)."""
    from rlhf.algos import GRPO, KLLoss, PPOClipLoss, kl_k3
    from rlhf.data.generators import arithmetic_rows
    from rlhf.data.prompts import PromptDataset
    from rlhf.models.loading import load_tokenizer
    from rlhf.rewards.gsm8k import gsm8k_score
    from rlhf.rewards.manager import RewardManager
    from rlhf.rollout.sampling import SamplingParams
    from rlhf.trainers.evaluate import Evaluator
    from rlhf.trainers.rl import RLTrainer
    from rlhf.workers.objectives import PolicyObjective
    from rlhf.workers.training import TrainingSetup
    from rlhf_configs.pieces import policy_group

    tokenizer = fdl.Config(load_tokenizer, model)
    reward = fdl.Config(RewardManager, scorers={"arithmetic": fdl.Partial(gsm8k_score, method="flexible")})
    heldout = fdl.Config(PromptDataset, rows=fdl.Config(arithmetic_rows, n=eval_problems, seed=0, split="test"),
                         tokenizer=tokenizer, name="heldout")
    return fdl.Config(
        RLTrainer,
        policy=policy_group(
            model_path=model, ref_model_path=model, gpus_per_worker=1 if gpu else 0,
            objective=fdl.Config(PolicyObjective, policy_loss=fdl.Config(PPOClipLoss, clip_low=0.2, clip_high=0.28),
                                 kl_loss=fdl.Config(KLLoss, estimator=kl_k3, coef=0.001)),
            optimizer=fdl.Partial(torch.optim.AdamW, lr=1e-6),
            training=fdl.Config(TrainingSetup, micro_batch_size=16, compute_dtype="bfloat16" if gpu else "float32"),
        ),
        tokenizer=tokenizer,
        train_data=fdl.Config(PromptDataset, rows=fdl.Config(arithmetic_rows, n=7000, seed=0, split="train"),
                              tokenizer=tokenizer, name="train"),
        reward=reward,
        advantage=fdl.Config(GRPO, norm_by_std=True),
        sampling=fdl.Config(SamplingParams, n=4, temperature=1.0, max_new_tokens=24),
        prompts_per_step=prompts,
        total_steps=steps,
        evaluator=fdl.Config(Evaluator, dataset=heldout, reward=reward,
                             sampling=fdl.Config(SamplingParams, temperature=0.0, max_new_tokens=24)),
    )


# ---------------------------------------------------------------------------------------------- runs
def run_stage(stage, out: Path, mode: str, args) -> dict:
    """Run one RL stage graph in `mode`; its per-step metrics summarised."""
    from rlhf.trainers.rl import RLTrainer
    from rlhf_configs.async_rollout import use_async_rollout

    if mode in ASYNC:
        use_async_rollout(stage, placement=args.placement, correction=args.correction, **ASYNC[mode])
    elif mode == "sync_reseeded":  # the policy worker's torch seed: only the sampling changes
        stage.policy.worker.training.seed = 1
    elif mode != "sync":
        raise SystemExit(f"unknown mode {mode!r}; modes: sync, sync_reseeded, {', '.join(ASYNC)}")
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
        final = (run_in_process(stage, out) if args.runtime == "local"
                 else run_on_ray(stage, out, args.gpu, args.worker_niceness))
        wall = time.perf_counter() - start
    finally:
        RLTrainer.step = original
    return summarise(mode, steps, ends, final, wall)


def run_on_ray(stage, out: Path, gpu: bool, worker_niceness: int | None) -> dict:
    from rlhf.runtime.experiment import Experiment, run_experiment
    from rlhf.runtime.ray_runtime import RayRuntime

    runtime = fdl.Config(RayRuntime, num_cpus=None if gpu else 2)
    if worker_niceness is not None:
        runtime.worker_niceness = worker_niceness
    g = fdl.Config(Experiment, name="async_rollout", stages={"grpo": stage}, output_dir=str(out), progress=False,
                   runtime=runtime)
    return run_experiment(g)["grpo"]["metrics"]


def run_in_process(stage, out: Path) -> dict:
    """The stage on LocalRuntime without run_experiment (whose preflight imports Ray)."""
    from rlhf.runtime.local import LocalRuntime
    from rlhf.runtime.plan import bind_groups, compile_graph
    from rlhf.trainers.context import StageContext

    plan = compile_graph(stage)
    runtime = LocalRuntime()
    try:
        trainer = fdl.build(bind_groups(plan.driver, runtime.start_groups(plan)))
        return trainer.run(StageContext(out_dir=out / "grpo", progress=False))["metrics"]
    finally:
        runtime.shutdown()


def summarise(mode: str, steps: list[dict], ends: list[float], final: dict, wall: float) -> dict:
    steady = steps[1:] or steps
    seconds = ends[-1] - ends[0] if len(ends) > 1 else wall
    step_time = sum(m["timing_s/step"] for m in steady)
    if mode.startswith("sync") and mode != "sync_separate":
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
        "behaviour_weight_mean": mean("actor/behaviour_weight_mean"),
        "train_score_last": steps[-1].get("critic/score/mean"),
        "steps": len(steps),
    }


# ---------------------------------------------------------------------------------------------- main
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", default="tiny,tiny_balanced,smollm2", help="tiny, tiny_balanced, smollm2 (comma-separated)")
    parser.add_argument("--modes", default=",".join(MODES), help=f"sync, sync_reseeded, {', '.join(ASYNC)}")
    parser.add_argument("--rounds", type=int, default=2, help="alternations of the modes on the tiny job")
    parser.add_argument("--steps", type=int, default=250, help="GRPO steps of the tiny job (the main job's 250)")
    parser.add_argument("--prompts", type=int, default=64, help="prompts per step of the tiny job (x 8 samples)")
    parser.add_argument("--sft-steps", type=int, default=250, help="SFT steps of the tiny job (the recipe's 250)")
    parser.add_argument("--sft-checkpoint", default=None, help="reuse an SFT checkpoint of the tiny job")
    parser.add_argument("--balanced-steps", type=int, default=60, help="GRPO steps of the tiny_balanced job")
    parser.add_argument("--smol-steps", type=int, default=8, help="GRPO steps on SmolLM2 per run")
    parser.add_argument("--smol-prompts", type=int, default=8, help="prompts per SmolLM2 step (x 4 samples)")
    parser.add_argument("--smol-eval", type=int, default=64, help="held-out problems for SmolLM2's accuracy")
    parser.add_argument("--smol-rounds", type=int, default=1, help="alternations on SmolLM2 (each run is minutes)")
    parser.add_argument("--gpu", action="store_true", help="one GPU per worker group (a GPU machine)")
    parser.add_argument("--runtime", default="ray", choices=["ray", "local"],
                        help="local: every group in this process, no Ray (the asynchronous groups must then be "
                             "colocated: --placement colocated)")
    parser.add_argument("--placement", default="separate", choices=["separate", "colocated"],
                        help="the rollout group's placement in the asynchronous modes")
    parser.add_argument("--worker-niceness", type=int, default=None,
                        help="RayRuntime(worker_niceness=...): 15 is Ray's own default (before the runtime set 0)")
    parser.add_argument("--correction", default="bypass", choices=["bypass", "decoupled"],
                        help="how the asynchronous modes' loss corrects for the behaviour policy")
    args = parser.parse_args()
    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if args.runtime == "local" and args.placement == "separate" and args.modes != "sync":
        raise SystemExit("--runtime local runs every group in one process: use --placement colocated")

    modes = args.modes.split(",")
    out = Path(tempfile.mkdtemp(prefix="async_rollout-"))
    report: dict = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "modes": modes,
                    "load_average_start": os.getloadavg(), "cpus": os.cpu_count(), "gpu": args.gpu,
                    "runtime": args.runtime, "placement": args.placement,
                    "worker_niceness": args.worker_niceness, "correction": args.correction, "jobs": {}}
    checkpoint, sft_accuracy = args.sft_checkpoint, None
    for job in args.jobs.split(","):
        if job in ("tiny", "tiny_balanced") and checkpoint is None:
            checkpoint, sft_accuracy = tiny_sft(out / "sft", args.sft_steps)
            print(f"tiny: SFT checkpoint {checkpoint} (held-out accuracy {sft_accuracy:.3f})", flush=True)
        if job == "tiny":
            make = lambda: tiny_stage(checkpoint, args.steps, args.prompts)  # noqa: E731
            rounds, settings = args.rounds, {"steps": args.steps, "prompts": args.prompts, "samples_per_prompt": 8,
                                             "sft_accuracy": sft_accuracy, "sft_steps": args.sft_steps}
        elif job == "tiny_balanced":
            make = lambda: slow_decoding(tiny_stage(checkpoint, args.balanced_steps, args.prompts))  # noqa: E731
            rounds, settings = args.rounds, {"steps": args.balanced_steps, "prompts": args.prompts,
                                             "samples_per_prompt": 8, "engine": "HFEngine(use_generate=True)"}
        elif job == "smollm2":
            from rlhf.models.importing import import_model

            model = str(import_model("smollm2-135m-instruct"))
            make = lambda: smollm2_stage(model, args.smol_steps, args.smol_prompts, args.smol_eval, args.gpu)  # noqa: E731
            rounds, settings = args.smol_rounds, {"steps": args.smol_steps, "prompts": args.smol_prompts,
                                                  "samples_per_prompt": 4, "max_new_tokens": 24,
                                                  "eval_problems": args.smol_eval}
        else:
            raise SystemExit(f"unknown job {job!r}: tiny, tiny_balanced or smollm2")
        runs: dict[str, list[dict]] = {m: [] for m in modes}
        for r in range(rounds):
            for mode in modes[r % len(modes):] + modes[: r % len(modes)]:  # rotate the order every round
                result = run_stage(make(), out / job / f"{mode}-{r}", mode, args)
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
    report_pruned(out)
    print(f"\nwrote {path}\n")
    print(table(report))
    return 0


def summary(runs: dict[str, list[dict]], modes: list[str]) -> dict:
    """Per mode: medians over rounds, and the speed-up over sync per round (median, min, max)."""
    out = {}
    for mode in modes:
        rs = runs[mode]
        entry = {k: statistics.median(r[k] for r in rs) for k in ("steps_per_s", "trainer_idle_fraction", "gen_s",
                                                                   "update_s", "step_s", "staleness_mean")}
        entry["accuracy"] = [r["accuracy"] for r in rs]
        if "sync" in runs and mode != "sync":
            ratios = [r["steps_per_s"] / s["steps_per_s"] for r, s in zip(rs, runs["sync"])]
            entry["speedup_vs_sync"] = {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}
            entry["accuracy_points_vs_sync"] = [100 * (r["accuracy"] - s["accuracy"]) for r, s in zip(rs, runs["sync"])
                                                if r["accuracy"] is not None and s["accuracy"] is not None]
        out[mode] = entry
    return out


def table(report: dict) -> str:
    lines = ["| job | mode | steps/s | x sync (median, range) | trainer idle | staleness | held-out accuracy | "
             "gen s | update s |", "|---|---|---|---|---|---|---|---|---|"]
    for job, data in report["jobs"].items():
        for mode, s in data["summary"].items():
            speed = s.get("speedup_vs_sync")
            ratio = f"{speed['median']:.2f}x ({speed['min']:.2f}-{speed['max']:.2f})" if speed else "1"
            acc = ", ".join(f"{100 * a:.1f}%" for a in s["accuracy"] if a is not None)
            lines.append(f"| {job} | {mode} | {s['steps_per_s']:.3f} | {ratio} | {100 * s['trainer_idle_fraction']:.0f}% "
                         f"| {s['staleness_mean']:.2f} | {acc} | {s['gen_s']:.2f} | {s['update_s']:.2f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
