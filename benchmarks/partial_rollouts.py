"""Streaming rollout with and without partial rollouts, on a multi-turn batch with a long-tailed turn count:
how long the trainer waits for its batch each step (`async/trainer_idle_s`).

The job: GRPO on the tiny model after a short SFT (so its turns end on EOS), multi-turn through `AgentRollout`
against an environment whose conversations end after the number of turns their row asks for: 1 turn for most
rows, `--long-turns` (default 8) for one prompt in `--long-every` (default 8). Without partial rollouts a batch
is done when its longest conversation is, so every batch holding a long prompt costs `--long-turns` turns of
one or two rows; with them the long conversations are carried into later batches and continue on newer
weights, and a batch is the first groups that ended (rlhf.agents.partial). Both modes: `fiddler:streaming`
(newest weights, `max_staleness` 2 by default, waiting past the bound), the in-process runtime (the producer
thread and the trainer in one process, one torch thread each), the same seed, data and number of steps.

Modes alternate within each round (`--rounds`); the ratio partial / off of the mean trainer idle per step is
taken per round and reported as median and range. Step 1 (start-up) is left out of every statistic.

    nice -n 19 python benchmarks/partial_rollouts.py --rounds 3 --steps 12

Writes benchmarks/results/partial_rollouts-<time>.json and prints a Markdown table (docs/async.md).
"""

from __future__ import annotations

import argparse
import datetime
import functools
import itertools
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

from rlhf.agents import AgentRollout, StepResult  # noqa: E402

MODES = ["off", "partial"]


class TurnsEnvironment:
    """A conversation ends after the number of turns its row asks for (`extra_info["turns"]`)."""

    def reset(self, row):
        self.turns = int(row["extra_info"]["turns"])
        return list(row["raw_prompt"])

    def step(self, action):
        return StepResult([{"role": "user", "content": "Go on."}], done=action.turn >= self.turns)


def long_tailed_rows(n: int, long_every: int, long_turns: int) -> list[dict]:
    """Arithmetic rows; one in `long_every` asks for `long_turns` turns, the others for one."""
    from rlhf.data.generators import arithmetic_rows

    rows = arithmetic_rows(n, seed=3)
    for i, row in enumerate(rows):
        row["extra_info"] = {**row.get("extra_info", {}), "turns": long_turns if i % long_every == 0 else 1}
    return rows


def short_answer_model(out: Path) -> str:
    """The tiny model after 40 SFT steps on short answers: its turns end on EOS (a random model's never do)."""
    from rlhf.data.generators import arithmetic_rows
    from rlhf.data.sft import SFTDataset
    from rlhf.models.loading import load_tokenizer
    from rlhf.models.tiny import tiny_qwen2
    from rlhf.workers.objectives import SFTObjective
    from rlhf.workers.policy import PolicyWorker
    from rlhf.workers.training import TrainingSetup

    base = tiny_qwen2(str(out / "base"), hidden_size=32, num_layers=2, intermediate_size=128, seed=0)  # the tests' model
    torch.manual_seed(0)
    worker = PolicyWorker(base, objective=SFTObjective(), optimizer=functools.partial(torch.optim.AdamW, lr=1e-2),
                          training=TrainingSetup(micro_batch_size=64))
    data = SFTDataset(arithmetic_rows(256, seed=5), load_tokenizer(base))
    for batch in itertools.islice(data.shuffled(64, seed=0, bucketed=False), 40):
        worker.update(batch)
    return worker.save(str(out / "sft"))


def stage(model: str, args) -> fdl.Config:
    from rlhf.algos import GRPO
    from rlhf.data.prompts import PromptDataset
    from rlhf.models.loading import load_tokenizer
    from rlhf.rewards.arithmetic import digit_match_score
    from rlhf.rewards.manager import RewardManager
    from rlhf.rollout.sampling import SamplingParams
    from rlhf.trainers.rl import RLTrainer
    from rlhf.workers.objectives import PolicyObjective
    from rlhf.workers.training import TrainingSetup
    from rlhf_configs.pieces import policy_group

    tok = fdl.Config(load_tokenizer, model)
    return fdl.Config(
        RLTrainer,
        policy=policy_group(model_path=model, objective=fdl.Config(PolicyObjective), optimizer=fdl.Partial(torch.optim.AdamW, lr=1e-4),
                            training=fdl.Config(TrainingSetup, micro_batch_size=32)),
        tokenizer=tok,
        train_data=fdl.Config(PromptDataset, rows=long_tailed_rows(256, args.long_every, args.long_turns),
                              tokenizer=tok, raw_prompt=True),
        reward=fdl.Config(RewardManager, scorers={"arithmetic": digit_match_score}),
        advantage=fdl.Config(GRPO),
        sampling=fdl.Config(SamplingParams, n=4, max_new_tokens=8),
        rollout=fdl.Config(AgentRollout, environment=TurnsEnvironment, tokenizer=tok, max_turns=args.long_turns,
                           max_response_tokens=32 * args.long_turns),
        prompts_per_step=args.prompts, total_steps=args.steps, records=None, seed=0,
    )


def run(model: str, mode: str, out: Path, args) -> dict:
    """One run in `mode`; its per-step metrics (step 1 left out) summarised."""
    from rlhf.runtime.local import LocalRuntime
    from rlhf.runtime.plan import bind_groups, compile_graph
    from rlhf.trainers.context import StageContext
    from rlhf.trainers.rl import RLTrainer
    from rlhf_configs.async_rollout import use_async_rollout

    graph = stage(model, args)
    use_async_rollout(graph, max_staleness=args.max_staleness, weights="newest", partial_rollouts=mode == "partial")
    steps: list[dict] = []
    original = RLTrainer.step

    @functools.wraps(original)
    def recording(self, rollouts, needs, n):
        metrics, batch = original(self, rollouts, needs, n)
        steps.append(dict(metrics))
        return metrics, batch

    RLTrainer.step = recording
    runtime = LocalRuntime()
    started = time.perf_counter()
    try:
        plan = compile_graph(graph)
        trainer = fdl.build(bind_groups(plan.driver, runtime.start_groups(plan)))
        trainer.run(StageContext(out_dir=out, progress=False))
    finally:
        RLTrainer.step = original
        runtime.shutdown()
    steady = steps[1:]
    values = lambda key: [m.get(key, 0.0) for m in steady]  # noqa: E731
    return {
        "mode": mode, "wall_s": time.perf_counter() - started, "steps": len(steps),
        "trainer_idle_s_median": statistics.median(values("async/trainer_idle_s")),
        "trainer_idle_s_mean": statistics.fmean(values("async/trainer_idle_s")),
        "step_s_mean": statistics.fmean(values("timing_s/step")),
        "trainer_idle_fraction": sum(values("async/trainer_idle_s")) / sum(values("timing_s/step")),
        "num_turns_max": max(values("num_turns/max")), "num_turns_mean": statistics.fmean(values("num_turns/mean")),
        "staleness_mean": statistics.fmean(values("async/staleness/mean")),
        "staleness_max": max(values("async/staleness/max")),
        "partial_samples_mean": statistics.fmean(values("async/partial_samples")),
        "versions_per_sample_max": max(values("async/versions_per_sample/max")),
        "partial_dropped_total": sum(values("async/partial_dropped")),
        "score_mean": statistics.fmean(values("critic/score/mean")),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--prompts", type=int, default=8, help="prompts per step (x 4 samples)")
    parser.add_argument("--long-every", type=int, default=8)
    parser.add_argument("--long-turns", type=int, default=8)
    parser.add_argument("--max-staleness", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(1)
    load = os.getloadavg()[0]
    runs: dict[str, list[dict]] = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory() as tmp:
        model = short_answer_model(Path(tmp))
        for r in range(args.rounds):
            order = MODES if r % 2 == 0 else MODES[::-1]  # alternate which mode runs first
            for mode in order:
                result = run(model, mode, Path(tmp) / f"{mode}-{r}", args)
                runs[mode].append(result)
                print(json.dumps(result), flush=True)
    ratios = [p["trainer_idle_s_mean"] / o["trainer_idle_s_mean"] for o, p in zip(runs["off"], runs["partial"])]
    speed = [o["step_s_mean"] / p["step_s_mean"] for o, p in zip(runs["off"], runs["partial"])]
    report = {
        "settings": vars(args), "load_average_start": load, "load_average_end": os.getloadavg()[0],
        "runs": runs,
        "idle_ratio_partial_over_off": {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)},
        "step_speedup_partial": {"median": statistics.median(speed), "min": min(speed), "max": max(speed)},
    }
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    path = ROOT / "benchmarks" / "results" / f"partial_rollouts-{stamp}.json"
    path.write_text(json.dumps(report, indent=2))
    print(table(report))
    print(f"written to {path}")
    return 0


def table(report: dict) -> str:
    lines = ["| mode | trainer idle / step (mean s) | idle fraction | step s | turns max | staleness mean / max "
             "| partial samples / step | dropped |", "|---|---|---|---|---|---|---|---|"]
    for mode, runs in report["runs"].items():
        med = lambda key: statistics.median(r[key] for r in runs)  # noqa: E731
        lines.append(f"| {mode} | {med('trainer_idle_s_mean'):.3f} | {med('trainer_idle_fraction'):.0%} | "
                     f"{med('step_s_mean'):.3f} | {med('num_turns_max'):.0f} | {med('staleness_mean'):.2f} / "
                     f"{max(r['staleness_max'] for r in runs):.0f} | {med('partial_samples_mean'):.1f} | "
                     f"{sum(r['partial_dropped_total'] for r in runs):.0f} |")
    ratio, speed = report["idle_ratio_partial_over_off"], report["step_speedup_partial"]
    lines.append(f"\nidle partial / off: {ratio['median']:.2f} ({ratio['min']:.2f}-{ratio['max']:.2f}); "
                 f"step speed-up: {speed['median']:.2f}x ({speed['min']:.2f}-{speed['max']:.2f})")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
