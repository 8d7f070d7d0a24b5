"""A reward-model step and a DPO step: rlhf's stages against TRL 1.16's RewardTrainer and DPOTrainer.

    RLHF_TRL_PATH=/tmp/trl/x python benchmarks/preference_vs_trl.py            # SmolLM2-135M-Instruct, 3 reps
    RLHF_TRL_PATH=/tmp/trl/x python benchmarks/preference_vs_trl.py --quick    # the tiny model, 1 rep (the test)
    ... --tasks dpo --frameworks ours trl trl-per-step --reps 5 --answer-words 80 --gradient-checkpointing

(`RLHF_TRL_PATH`: an extracted TRL wheel where TRL is not installed; benchmarks/bench_peer.py says how.)

Identical work on both sides: the same pairs file (everyday questions with an on-topic chosen answer and an
off-topic rejected one, conversational layout, rendered by the model's chat template on both sides), the
same pairs per optimizer step in one micro-batch, the same maximum length (no pair reaches it), float32
weights and compute, AdamW with the same learning rate (our stages' defaults: 1e-5 for the reward model,
1e-6 for DPO), weight decay (0.01 / 0) and gradient clipping (1.0), gradient checkpointing off on both (TRL
defaults it on; `--gradient-checkpointing` turns it on for both), one torch thread per process. The reward
model is a one-label sequence-classification head on the causal LM, Bradley-Terry loss; DPO is the sigmoid
loss with beta 0.1 against the starting model.

What each side does for DPO's reference: ours (`dpo_stage`'s default) computes every pair's reference
log-probs once before the first step and reads them from its cache; "trl" sets TRL's
`precompute_ref_log_probs=True`, the same thing; "trl-per-step" is TRL's default, a frozen reference model
and its forward in every step (the work per step differs: shown for what a default user gets, never ratioed
as like for like). Remaining differences, each side as it ships: our batches hold pairs of similar lengths
(`bucketed=True`), TRL's are drawn at random; our rows are [left-padded prompt | right-padded completion],
TRL's right-padded whole sequences; both compute log-probs with a fused LM head on completion positions.

Every run is a fresh process; runs alternate (ours, TRL, ours, TRL ..., the order rotated each
repetition), the first `--discard` steps of each run are dropped, and each figure is the median over
repetitions of each run's median. The TRL/ours ratio is taken per repetition (the two runs next to each
other, under the same load) and given as median (min-max). Peak memory is the kernel's high-water mark of
the process's resident memory (VmHWM) during set-up, during the steps, and over the whole run, plus the
summed RSS of the process tree polled every 0.2 s. Each side's steps are split into the same phases
(bench_preference.py). Results go to benchmarks/results/preference_vs_trl-<time>.json with the machine
description and the load average before and after each run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from bench_peer import ratio_spread, trl_missing_reason  # noqa: E402
from bench_procs import load_average, machine_info, run_child  # noqa: E402

TASKS = ("rm", "dpo")
FRAMEWORKS = ("ours", "trl", "trl-per-step")
SMOLLM2 = "smollm2-135m-instruct"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="the tiny model, 4 pairs per step, 3 steps, 1 repetition (the test; harness development)")
    p.add_argument("--model", default=None, help=f"a causal-LM folder (default: {SMOLLM2} from `rlhf models import`)")
    p.add_argument("--tasks", nargs="*", default=list(TASKS), choices=TASKS)
    p.add_argument("--frameworks", nargs="*", default=["ours", "trl"], choices=FRAMEWORKS,
                   help="trl: DPO with precomputed reference log-probs (as ours); trl-per-step: TRL's default")
    p.add_argument("--pairs-per-step", type=int, default=8, help="pairs per optimizer step (one micro-batch)")
    p.add_argument("--answer-words", type=int, default=45, help="words per answer (+-25%%)")
    p.add_argument("--max-length", type=int, default=512, help="tokens per conversation, both sides (none reaches it)")
    p.add_argument("--steps", type=int, default=4, help="optimizer steps per run")
    p.add_argument("--discard", type=int, default=1, help="first steps of each run left out (warm-up)")
    p.add_argument("--reps", type=int, default=3, help="fresh-process runs per framework and task")
    p.add_argument("--gradient-checkpointing", action="store_true", help="on for both sides (default: off for both)")
    p.add_argument("--timeout", type=float, default=900, help="seconds before a run is killed")
    p.add_argument("--note", default="", help="a line stored with the results (e.g. how the machine was shared)")
    p.add_argument("--out", default=None, help="results JSON (default: benchmarks/results/preference_vs_trl-<time>.json)")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--result-file", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.pairs_per_step, args.answer_words, args.steps, args.discard, args.reps = 4, 6, 3, 1, 1
    if args.steps <= args.discard:
        p.error(f"--steps {args.steps} must exceed --discard {args.discard} (no step would be measured)")
    return args


def model_path(args: argparse.Namespace) -> str:
    if args.model is not None:
        return str(Path(args.model).resolve())
    if args.quick:  # the tiny Qwen2 of the tests (byte-level tokenizer, ChatML template), built offline
        from bench_preference import OUT_ROOT

        from rlhf.models.tiny import tiny_qwen2

        return str(Path(tiny_qwen2(str(ROOT / OUT_ROOT / "tiny-h64-l2"), hidden_size=64, num_layers=2,
                                   intermediate_size=256, seed=0)).resolve())
    from rlhf.models.importing import model_folder

    return str(model_folder(SMOLLM2))


# ------------------------------------------------------------------------- runs
def run_one(spec: dict, timeout: float) -> dict:
    load_before = load_average()
    with tempfile.TemporaryDirectory(prefix="bench-pref-") as tmp:
        result_file = str(Path(tmp) / "result.json")
        code, tail, memory = run_child(
            [sys.executable, str(HERE / "preference_vs_trl.py"), "--child", json.dumps(spec), "--result-file",
             result_file], cwd=ROOT, timeout=timeout)
        result = json.loads(Path(result_file).read_text()) if code == 0 and Path(result_file).exists() else None
    head = {"framework": spec["framework"], "task": spec["task"]}
    if result is None:
        print(f"  {spec['framework']} {spec['task']} FAILED (exit {code}):\n{tail}", flush=True)
        return {**head, "ok": False, "exit": code, "tail": tail, **memory}
    return {**head, "ok": True, "load_before": load_before, "load_after": load_average(), **memory, **result}


def _median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def run_figures(run: dict, discard: int) -> dict:
    """One run's medians over its kept steps."""
    steps = run["per_step"][discard:]
    keys = sorted({k for s in steps for k in s if k.startswith("phase_s/")})
    phases = {k.removeprefix("phase_s/"): _median([s.get(k, 0.0) for s in steps]) for k in keys}
    phases["other"] = _median([s["step_s"] - sum(s.get(k, 0.0) for k in keys) for s in steps])
    peaks = run["peak_rss_by_phase_mib"]
    return {
        "step_s": _median([s["step_s"] for s in steps]),
        "cpu_s": _median([s["cpu_s"] for s in steps]),
        "tokens_per_step": _median([s.get("tokens") for s in steps]),
        "phases": phases,
        "peak_rss_steps_mib": peaks.get("steps"),
        "peak_rss_run_mib": max(peaks.values()),
        "peak_rss_polled_mib": run["peak_rss_mib"],
        "setup_s": run["setup_s"],
        "reference_pass_s": run["setup_phases_s"].get("reference_pass"),
    }


def summarise(runs: list[dict], tasks: list[str], frameworks: list[str], discard: int) -> dict:
    summary: dict[str, dict] = {}
    for task in tasks:
        row: dict[str, dict] = {}
        kept = [r for r in runs if r["ok"] and r["task"] == task]
        for fw in frameworks:
            figs = [run_figures(r, discard) for r in kept if r["framework"] == fw]
            if not figs:
                continue
            agg = {k: _median([f[k] for f in figs]) for k in figs[0] if k != "phases"}
            agg["step_s_runs"] = [round(f["step_s"], 3) for f in figs]
            agg["phases"] = {k: _median([f["phases"].get(k) for f in figs]) for k in dict.fromkeys(
                k for f in figs for k in f["phases"])}
            row[fw] = agg
        ours = {r["rep"]: run_figures(r, discard) for r in kept if r["framework"] == "ours"}
        for fw in [fw for fw in frameworks if fw != "ours" and fw in row and "ours" in row]:
            pairs = [(run_figures(r, discard), ours[r["rep"]]) for r in kept if r["framework"] == fw and r["rep"] in ours]
            for key, prefix in (("step_s", "speedup"), ("cpu_s", "cpu_speedup"), ("peak_rss_steps_mib", "rss_steps_ratio"),
                                ("peak_rss_run_mib", "rss_run_ratio")):
                row[fw].update(ratio_spread([t[key] / o[key] for t, o in pairs if t[key] and o[key]], prefix))
        summary[task] = row
    return summary


def table(summary: dict) -> str:
    lines = ["| task | framework | s/step (median) | runs | CPU s/step | tokens/step | TRL / ours per repetition: "
             "median (range) | same, CPU s | peak RSS MiB: steps / whole run | TRL / ours peak RSS (steps) | "
             "set-up s (reference pass) |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for task, row in summary.items():
        for fw, f in row.items():
            ratio, cpu_ratio, rss_ratio = (
                f"{f[k + '_median']:.2f}x ({f[k + '_range'][0]:.2f}-{f[k + '_range'][1]:.2f})" if k + "_median" in f
                else "" for k in ("speedup", "cpu_speedup", "rss_steps_ratio"))
            ref = f" ({f['reference_pass_s']:.1f})" if f.get("reference_pass_s") else ""
            lines.append(
                f"| {task} | {fw} | {f['step_s']:.3f} | {', '.join(f'{x:.3f}' for x in f['step_s_runs'])} | "
                f"{f['cpu_s']:.3f} | {f['tokens_per_step'] or 0:.0f} | {ratio} | {cpu_ratio} | "
                f"{f['peak_rss_steps_mib']:.0f} / {f['peak_rss_run_mib']:.0f} | {rss_ratio} | {f['setup_s']:.1f}{ref} |")
    keys = list(dict.fromkeys(k for row in summary.values() for f in row.values() for k in f["phases"]))
    lines += ["", "Each step split (median seconds; the same wrappers on both sides, bench_preference.py):", "",
              "| task | framework | " + " | ".join(keys) + " |", "|---" * (len(keys) + 2) + "|"]
    for task, row in summary.items():
        for fw, f in row.items():
            lines.append(f"| {task} | {fw} | " + " | ".join(f"{f['phases'].get(k) or 0.0:.4f}" for k in keys) + " |")
    return "\n".join(lines)


def main(argv=None) -> None:
    t0 = time.perf_counter()
    args = parse_args(argv)
    if args.child:
        from bench_preference import child_main, write_json

        return write_json(args.result_file, child_main(json.loads(args.child), t0))
    os.chdir(ROOT)
    if any(fw.startswith("trl") for fw in args.frameworks) and (reason := trl_missing_reason()):
        sys.exit(reason)
    from bench_preference import write_pairs

    model = model_path(args)
    data = str(write_pairs(args.pairs_per_step * args.steps, args.answer_words).resolve())
    machine = machine_info(ROOT)
    print(f"machine: {machine['cpu_model']}, {machine['logical_cpus']} CPUs, {machine['ram_gib']} GiB, "
          f"load {machine['load_average_at_start']}; model {model}; pairs {data}", flush=True)
    started = datetime.datetime.now()
    out = Path(args.out) if args.out else HERE / "results" / f"preference_vs_trl-{started:%Y%m%d-%H%M%S}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    runs: list[dict] = []

    def save(summary=None, text=None):  # after every run, so an interrupted run keeps what it measured
        out.write_text(json.dumps({
            "started": started.isoformat(timespec="seconds"), "complete": summary is not None,
            "args": {k: v for k, v in vars(args).items() if k not in ("child", "result_file")},
            "note": args.note, "model": model, "pairs_file": data, "machine": machine,
            "summary": summary, "table_markdown": text, "runs": runs,
        }, indent=1, default=str))

    frameworks = list(args.frameworks)
    for rep in range(args.reps):
        order = frameworks[rep % len(frameworks):] + frameworks[: rep % len(frameworks)]
        for task in args.tasks:
            for fw in order:
                if fw == "trl-per-step" and task != "dpo":
                    continue  # a reward model has no reference
                spec = {"framework": fw, "task": task, "model": model, "data": data, "steps": args.steps,
                        "pairs_per_step": args.pairs_per_step, "max_length": args.max_length,
                        "gradient_checkpointing": args.gradient_checkpointing}
                run = run_one(spec, args.timeout)
                run["rep"] = rep
                runs.append(run)
                save()
                if run["ok"]:
                    f = run_figures(run, args.discard)
                    print(f"rep {rep} {task:3s} {fw:12s} median {f['step_s']:.3f} s/step (CPU {f['cpu_s']:.3f}), "
                          f"{f['tokens_per_step'] or 0:.0f} tokens/step, peak RSS steps {f['peak_rss_steps_mib']:.0f} "
                          f"MiB / run {f['peak_rss_run_mib']:.0f} MiB, set-up {f['setup_s']:.1f} s, "
                          f"load {load_average()[0]}", flush=True)
                    print("    " + ", ".join(f"{k} {v:.3f}" for k, v in f["phases"].items() if v is not None),
                          flush=True)
    summary = summarise(runs, args.tasks, frameworks, args.discard)
    machine["load_average_at_end"] = load_average()
    text = table(summary)
    print("\n" + text)
    save(summary, text)
    print(f"\nresults: {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")
    if not all(r["ok"] for r in runs):
        sys.exit(f"{sum(not r['ok'] for r in runs)} run(s) failed; see {out}")


if __name__ == "__main__":
    main()
