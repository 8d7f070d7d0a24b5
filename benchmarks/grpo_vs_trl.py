"""GRPO step time, throughput and memory: rlhf (Ray and LocalRuntime) against TRL's GRPOTrainer.

    python benchmarks/grpo_vs_trl.py             # full: 20 steps, 3 repetitions, every workload
    python benchmarks/grpo_vs_trl.py --quick     # 6 steps, 1 repetition (harness development)
    python benchmarks/grpo_vs_trl.py --workloads tiny/8tok/beta0 --reps 5
    python benchmarks/grpo_vs_trl.py --model PATH --tokens 64 256   # a real model as it is (see below)

Identical work on both sides: the same tiny Qwen2 model (byte-level tokenizer, float32)
warm-started once by our SFT stage (cached under outputs/bench_grpo_vs_trl/), two-digit
addition prompts, exact-match reward, 16 prompts x 8 samples per step, temperature 1.0,
AdamW lr 1e-4 (weight decay 0.01), gradient clipping 1.0, one optimizer step per RL step,
clip epsilon 0.2 both sides, token-mean loss (TRL "dapo"), group-std-scaled advantages
(TRL scale_rewards="group", our GRPO(norm_by_std=True) with TRL's eps 1e-4), k3 KL to the
reference when beta > 0, one torch thread per process. Remaining differences: TRL's group
std is the same Bessel std; TRL computes the loss over prompt+completion logits with its
fused LM head, we over response positions only; prompts are drawn in a different order
(same distribution).

Every run is a fresh process (start-up and memory measured cleanly), runs alternate
between frameworks (TRL, Ray, Local rotated each repetition), the first `--discard` steps
of each run are dropped, and the table gives medians over repetitions of each run's
median. Peak memory is the summed RSS of the run's process tree (Ray: driver, GCS, raylet,
daemons and the worker actor). Results go to benchmarks/results/ with the machine
description and the load average before and after.

`--model PATH` runs a given model folder as it is (no SFT warm start; e.g. SmolLM2-135M-Instruct
from `rlhf models import smollm2-135m-instruct`), LocalRuntime against TRL by default: 16 prompts x
4 samples, every completion forced to `--tokens` new tokens on both sides (`min_new_tokens`), k3 KL
0.04 to a reference model, `--micro-batch` completions per forward/backward on both sides (TRL:
per_device_train_batch_size with gradient accumulation up to one optimizer step per generation
batch), and a last-number reward (a chat model explains before it answers). Each figure is a
median over repetitions; the TRL/rlhf ratio is taken per repetition (the runs next to each other)
and given with its spread. Both sides' phases are timed inside the run (ours: the worker's calls,
its optimizer step and clipping; TRL: its `_generate`, log-prob passes, backward and AdamW step).
"""

from __future__ import annotations

import argparse
import dataclasses
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

from bench_peer import ratio_spread  # noqa: E402
from bench_procs import load_average, machine_info, run_child  # noqa: E402
from bench_workloads import SIZES, Workload  # noqa: E402

FRAMEWORKS = ("trl", "ray", "local", "ray+full", "local+full", "ray+compile", "local+compile")
"""ray/local: rlhf as it is; +full: with shared_prefix=False (every row's prompt encoded again, as before that change);
+compile: with TrainingSetup(compile=True) (norms and MLPs compiled; the compile falls in the discarded first step)."""
DEFAULT_WORKLOADS = (
    Workload("tiny", 8, 0.0),
    Workload("tiny", 8, 0.04),
    Workload("tiny", 64, 0.04, full_length=True),
    Workload("5m", 8, 0.04),
)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="6 steps, 1 repetition, discard 1 (harness development)")
    p.add_argument("--steps", type=int, default=None, help="steps per run (default 20; 2 with --model)")
    p.add_argument("--steps-5m", type=int, default=10, help="steps of the 5m-model runs (each step takes seconds)")
    p.add_argument("--discard", type=int, default=None,
                   help="first steps of each run left out of the figures (default 2; 1 with --model)")
    p.add_argument("--reps", type=int, default=3, help="fresh-process runs per framework and workload")
    p.add_argument("--workloads", nargs="*", default=None,
                   help="names like tiny/8tok/beta0.04 (default: " + ", ".join(w.name for w in DEFAULT_WORKLOADS) + ")")
    p.add_argument("--frameworks", nargs="*", default=["trl", "ray", "local"], choices=FRAMEWORKS)
    p.add_argument("--timeout", type=float, default=None, help="seconds before a run is killed (600; 3600 with --model)")
    p.add_argument("--out", default=None, help="results JSON (default: benchmarks/results/grpo_vs_trl-<time>.json)")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--prepare", default=None, help=argparse.SUPPRESS)
    p.add_argument("--generation", default=None, help=argparse.SUPPRESS)
    p.add_argument("--no-generation", action="store_true", help="skip the generation-only comparison")
    p.add_argument("--result-file", default=None, help=argparse.SUPPRESS)
    real = p.add_argument_group("a given model (--model)")
    real.add_argument("--model", default=None, help="a model folder, used as it is (no SFT warm start)")
    real.add_argument("--tokens", nargs="*", type=int, default=[64, 256], help="new tokens per completion (all forced)")
    real.add_argument("--prompts", type=int, default=16)
    real.add_argument("--samples", type=int, default=4)
    real.add_argument("--micro-batch", type=int, default=16, help="completions per forward/backward, both sides")
    real.add_argument("--beta", type=float, default=0.04, help="k3 KL coefficient to the reference model")
    args = p.parse_args(argv)
    args.timeout = args.timeout or (3600 if args.model else 600)
    args.steps = args.steps or (2 if args.model else 20)
    args.discard = args.discard if args.discard is not None else (1 if args.model else 2)
    if args.quick:
        args.steps, args.steps_5m, args.reps, args.discard = 6, 4, 1, 1
    if args.model is not None and "--frameworks" not in (argv if argv is not None else sys.argv):
        args.frameworks = ["trl", "local"]
    return args


def model_workloads(args: argparse.Namespace) -> list[Workload]:
    """`--model`'s workloads: one per `--tokens`, every completion full length."""
    name = Path(args.model).name
    return [Workload(name, t, args.beta, full_length=True, model=str(Path(args.model).resolve()), prompts=args.prompts,
                     samples=args.samples, micro_batch=args.micro_batch) for t in args.tokens]


def parse_workload(name: str) -> Workload:
    size, tokens, beta = name.split("/")
    tokens, _, full = tokens.partition("-")
    return Workload(size, int(tokens.removesuffix("tok")), float(beta.removeprefix("beta")), full_length=full == "full")


# ------------------------------------------------------------------------- children
def child(spec_json: str, result_file: str, t0: float) -> None:
    from bench_workloads import child_main, write_json

    write_json(result_file, child_main(json.loads(spec_json), t0))


def prepare(size: str, result_file: str) -> None:
    from bench_workloads import sft_checkpoint, write_json

    write_json(result_file, sft_checkpoint(SIZES[size]))


def generation(spec_json: str, result_file: str) -> None:
    from bench_generation import measure
    from bench_workloads import write_json

    spec = json.loads(spec_json)
    write_json(result_file, measure(spec["checkpoint"], spec["max_new_tokens"], spec["full_length"]))


def generation_comparison(workloads: list[Workload], checkpoints: dict) -> dict:
    out = {}
    for size, tokens, full in sorted({(w.size, w.max_new_tokens, w.full_length) for w in workloads}):
        spec = {"checkpoint": checkpoints[size]["checkpoint"], "max_new_tokens": tokens, "full_length": full}
        code, tail, _, result = _python_child(["--generation", json.dumps(spec)], timeout=600)
        if result is None:
            print(f"generation comparison {size}/{tokens}tok failed (exit {code}):\n{tail}", flush=True)
            continue
        name = f"{size}/{tokens}tok{'-full' if full else ''}"
        out[name] = result
        print(f"generation {name}: engine {result['engine']['median_s']:.3f} s, engine_generate "
              f"{result['engine_generate']['median_s']:.3f} s, generate {result['generate']['median_s']:.3f} s "
              f"({result['speedup_vs_generate']:.2f}x), load {load_average()[0]}", flush=True)
    return out


def _python_child(args: list[str], timeout: float) -> tuple[int, str, dict, dict | None]:
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        result_file = str(Path(tmp) / "result.json")
        code, tail, memory = run_child(
            [sys.executable, str(HERE / "grpo_vs_trl.py"), *args, "--result-file", result_file], cwd=ROOT,
            timeout=timeout,
        )
        result = json.loads(Path(result_file).read_text()) if code == 0 and Path(result_file).exists() else None
    return code, tail, memory, result


def prepare_checkpoints(sizes: set[str]) -> dict[str, dict]:
    """The SFT checkpoint of each model size: trained once (minutes), then read from its record."""
    from bench_workloads import OUT_ROOT

    out = {}
    for size in sorted(sizes):
        record = ROOT / OUT_ROOT / f"sft-{size}-{SIZES[size].sft_steps}steps.json"
        if record.exists() and (ROOT / json.loads(record.read_text())["checkpoint"]).exists():
            out[size] = json.loads(record.read_text())
        else:
            start = time.perf_counter()
            code, tail, _, result = _python_child(["--prepare", size], timeout=3600)
            if result is None:
                sys.exit(f"SFT warm start of {size!r} failed (exit {code}):\n{tail}")
            record.write_text(json.dumps(result, indent=1))
            out[size] = result
            print(f"SFT warm start {size}: {time.perf_counter() - start:.0f} s", flush=True)
        print(f"SFT checkpoint {size}: {out[size]['params'] / 1e6:.2f}M params, {out[size]['sft_metrics']}", flush=True)
    return out


def run_one(framework: str, w: Workload, checkpoint: str, steps: int, timeout: float) -> dict:
    spec = {"framework": framework, "workload": dataclasses.asdict(w),
            "checkpoint": checkpoint, "steps": steps}
    load_before = load_average()
    code, tail, memory, result = _python_child(["--child", json.dumps(spec)], timeout)
    if result is None:
        print(f"  {framework} {w.name} FAILED (exit {code}):\n{tail}", flush=True)
        return {"framework": framework, "workload": w.name, "ok": False, "exit": code, "tail": tail, **memory}
    return {"framework": framework, "workload": w.name, "ok": True, "rows": w.rows, "load_before": load_before,
            "load_after": load_average(), **memory, **result}


# -------------------------------------------------------------------------- figures
def _median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def run_figures(run: dict, discard: int) -> dict:
    """One run's medians over its kept steps."""
    steps = run["per_step"][discard:]
    step_s = _median([s["step_s"] for s in steps])
    fig = {
        "step_s": step_s,
        "cpu_s": _median([s.get("cpu_s") for s in steps]),
        "gen_tokens_per_s": _median([s["gen_tokens"] / s["step_s"] for s in steps]),
        "completions_per_s": run["rows"] / step_s,
        "mean_gen_tokens_per_step": statistics.mean(s["gen_tokens"] for s in steps),
        "reward": statistics.mean(s["reward"] for s in steps),
        "peak_rss_mib": run["peak_rss_mib"],
        "peak_pss_mib": run["peak_pss_mib"],
        "setup_s": run["setup_s"],
    }
    fig["phases"] = trl_phase_split(steps) if run["framework"] == "trl" else phase_split(steps)
    return fig


def trl_phase_split(steps: list[dict]) -> dict:
    """Median seconds of each timed part of TRL's step; `other` is the rest (rewards, advantages, logging)."""
    keys = sorted({k for s in steps for k in s if k.startswith("trl_s/")})
    parts = {k.removeprefix("trl_s/"): _median([s.get(k, 0.0) for s in steps]) for k in keys}
    parts["other"] = _median([s["step_s"] - sum(s.get(k, 0.0) for k in keys) for s in steps])
    return parts


def phase_split(steps: list[dict]) -> dict:
    """Median seconds of each part of our step (worker-side where the work is remote)."""

    def med(key: str) -> float:
        return _median([s.get(key, 0.0) for s in steps]) or 0.0

    # update computes the reference log-probs itself (PolicyWorker.requirements): shown apart
    ref = [s.get("timing_s/ref_worker", 0.0) + s.get("timing_s/ref_in_update", 0.0) for s in steps]
    update = [s.get("timing_s/update_worker", 0.0) - s.get("timing_s/ref_in_update", 0.0) for s in steps]
    forward_backward = [u - s.get("timing_s/optimizer_worker", 0.0) - s.get("timing_s/clip_worker", 0.0)
                        for u, s in zip(update, steps)]
    parts = {
        "generate": med("timing_s/gen_worker"),
        "reward": med("timing_s/reward"),
        "log_probs_old": med("timing_s/old_log_prob_worker"),
        "log_probs_ref": _median(ref),
        "advantage": med("timing_s/adv"),
        "update": _median(update),
        "of_which_forward_backward": _median(forward_backward),
        "of_which_optimizer": med("timing_s/optimizer_worker"),
        "of_which_clip": med("timing_s/clip_worker"),
        "weight_sync": 0.0,  # hybrid engine: the HF engine generates with the actor's own module
    }
    overhead = [
        s["step_s"] - sum(s.get(k, 0.0) for k in ("timing_s/gen_worker", "timing_s/reward", "timing_s/old_log_prob_worker",
                                                  "timing_s/ref_worker", "timing_s/adv", "timing_s/update_worker"))
        for s in steps
    ]
    dispatch = [
        sum(s.get(f"timing_s/{p}", 0.0) - s.get(f"timing_s/{w}", 0.0)
            for p, w in (("gen", "gen_worker"), ("old_log_prob", "old_log_prob_worker"), ("ref", "ref_worker"),
                         ("update_actor", "update_worker")))
        for s in steps
    ]
    parts["runtime_overhead"] = _median(overhead)
    parts["of_which_dispatch"] = _median(dispatch)
    parts["overhead_share"] = _median([o / s["step_s"] for o, s in zip(overhead, steps)])
    return parts


def summarise(runs: list[dict], workloads: list[Workload], frameworks: list[str], discard: int) -> dict:
    summary: dict[str, dict] = {}
    for w in workloads:
        row: dict[str, dict] = {}
        kept = [r for r in runs if r["ok"] and r["workload"] == w.name]
        for fw in frameworks:
            mine = [r for r in kept if r["framework"] == fw]
            figs = [run_figures(r, discard) for r in mine]
            if not figs:
                continue
            agg = {k: _median([f[k] for f in figs]) for k in figs[0] if k != "phases"}
            agg["step_s_runs"] = [round(f["step_s"], 4) for f in figs]
            keys = dict.fromkeys(k for f in figs for k in f["phases"])
            agg["phases"] = {k: _median([f["phases"].get(k) for f in figs]) for k in keys}
            row[fw] = agg
        if "trl" in row:
            trl = {r["rep"]: run_figures(r, discard) for r in kept if r["framework"] == "trl"}
            for fw in FRAMEWORKS[1:]:
                if fw in row:
                    row[fw]["speedup_vs_trl"] = row["trl"]["step_s"] / row[fw]["step_s"]
                    # per repetition: TRL's run and ours ran next to each other, under the same load
                    mine = [(trl[r["rep"]], run_figures(r, discard)) for r in kept if r["framework"] == fw and r["rep"] in trl]
                    ratios = [a["step_s"] / b["step_s"] for a, b in mine]
                    cpu_ratios = [a["cpu_s"] / b["cpu_s"] for a, b in mine if a["cpu_s"] and b["cpu_s"]]
                    row[fw].update(ratio_spread(ratios, "speedup"))
                    # CPU seconds: what contention on a shared machine changes least
                    row[fw].update(ratio_spread(cpu_ratios, "cpu_speedup"))
        summary[w.name] = row
    return summary


def table(summary: dict) -> str:
    lines = [
        "| workload | framework | s/step (median) | runs | CPU s/step | gen tok/s | completions/s | peak RSS MiB (PSS) | "
        "TRL / rlhf per repetition: median (range) | same, CPU seconds | reward |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, row in summary.items():
        for fw, f in row.items():
            runs = ", ".join(f"{x:.3f}" for x in f["step_s_runs"])
            speed, cpu_speed = (
                f"{f[k + '_median']:.2f}x ({f[k + '_range'][0]:.2f}-{f[k + '_range'][1]:.2f})" if k + "_median" in f else ""
                for k in ("speedup", "cpu_speedup"))
            cpu = f"{f['cpu_s']:.2f}" if f.get("cpu_s") is not None else ""
            lines.append(
                f"| {name} | {fw} | {f['step_s']:.3f} | {runs} | {cpu} | {f['gen_tokens_per_s']:.0f} | "
                f"{f['completions_per_s']:.2f} | {f['peak_rss_mib']:.0f} ({f['peak_pss_mib']:.0f}) | {speed} | "
                f"{cpu_speed} | {f['reward']:.2f} |"
            )
    lines += ["", "Our step, split (median seconds; worker-side times for remote work):", "",
              "| workload | runtime | generate | reward | log-probs ref | update (fwd+bwd / AdamW / clip) | adv | "
              "weight sync | overhead (of which dispatch) | overhead share |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for name, row in summary.items():
        for fw, f in row.items():
            if fw == "trl":
                continue
            p = f["phases"]
            lines.append(
                f"| {name} | {fw} | {p['generate']:.4f} | {p['reward']:.4f} | {p['log_probs_ref']:.4f} | "
                f"{p['update']:.4f} ({p['of_which_forward_backward']:.4f} / {p['of_which_optimizer']:.4f} / "
                f"{p['of_which_clip']:.4f}) | {p['advantage']:.4f} | {p['weight_sync']:.1f} | "
                f"{p['runtime_overhead']:.4f} ({p['of_which_dispatch']:.4f}) | {100 * p['overhead_share']:.1f}% |"
            )
    trl = {name: row["trl"]["phases"] for name, row in summary.items() if "trl" in row}
    if trl:
        keys = list(dict.fromkeys(k for p in trl.values() for k in p))
        lines += ["", "TRL's step, split (median seconds, timed inside its trainer):", "",
                  "| workload | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
        for name, p in trl.items():
            lines.append(f"| {name} | " + " | ".join(f"{p.get(k) or 0.0:.4f}" for k in keys) + " |")
    return "\n".join(lines)


def utilisation(summary: dict, runs: list[dict], workloads: list[Workload], shape, peak_gflops: float) -> dict:
    """Per workload and framework: each phase's model FLOPs over its median seconds and the matmul peak
    (`bench_flops`; the same useful work counted for both sides). Prompt and response lengths are our runs'
    per-step means (the same prompts on both sides; `--model` forces every response to full length)."""
    from bench_flops import forward_flops, rollout_flops, update_flops

    out = {}
    for w in workloads:
        ours = [s for r in runs if r["ok"] and r["workload"] == w.name and r["framework"] != "trl"
                for s in r["per_step"] if s.get("prompt_length_mean")]
        if not ours or w.name not in summary:
            continue
        prompt = round(statistics.mean(s["prompt_length_mean"] for s in ours))
        response = round(statistics.mean(s["gen_tokens"] for s in ours) / w.rows)
        flops = {"generate": rollout_flops(shape, [prompt] * w.prompts, w.samples, [response] * w.rows),
                 "log_probs_ref": forward_flops(shape, prompt, response, w.rows, w.samples),
                 "update": update_flops(shape, prompt, response, w.rows, w.samples)}
        row = {"prompt_tokens": prompt, "response_tokens": response, "gflop": {k: v / 1e9 for k, v in flops.items()},
               "matmul_peak_gflops": peak_gflops, "frameworks": {}}
        for fw, fig in summary[w.name].items():
            p = fig["phases"]
            seconds = ({"generate": p.get("generate"), "log_probs_ref": p.get("log_probs_ref"),
                        "update": (p.get("forward") or 0.0) + (p.get("backward") or 0.0)} if fw == "trl" else
                       {"generate": p.get("generate"), "log_probs_ref": p.get("log_probs_ref"),
                        "update": p.get("of_which_forward_backward")})
            row["frameworks"][fw] = {k: flops[k] / 1e9 / (t * peak_gflops) if t else None for k, t in seconds.items()}
        out[w.name] = row
    return out


def utilisation_table(util: dict) -> str:
    if not util:
        return ""
    peak = next(iter(util.values()))["matmul_peak_gflops"]
    lines = ["", "", f"Utilisation per phase: model FLOPs over the phase's median seconds and one thread's fp32 "
             f"matmul peak ({peak:.0f} GFLOP/s); update = forward + backward, without AdamW:", "",
             "| workload | framework | generate | log-probs ref | update |", "|---|---|---|---|---|"]
    for name, row in util.items():
        for fw, u in row["frameworks"].items():
            cells = [f"{100 * u[k]:.0f}%" if u[k] else "-" for k in ("generate", "log_probs_ref", "update")]
            lines.append(f"| {name} | {fw} | {' | '.join(cells)} |")
    return "\n".join(lines)


def generation_table(gen: dict) -> str:
    if not gen:
        return ""
    lines = ["", "", "Generation alone, same batch (16 prompts x 8 samples; median s, tokens/s):", "",
             "| model/tokens | our engine | engine on `generate` | plain `generate` | vs `generate` |",
             "|---|---|---|---|---|"]
    for name, g in gen.items():
        cells = [f"{g[k]['median_s']:.3f} s ({g[k]['median_tokens_per_s']:.0f} tok/s)"
                 for k in ("engine", "engine_generate", "generate")]
        lines.append(f"| {name} | {' | '.join(cells)} | {g['speedup_vs_generate']:.2f}x |")
    return "\n".join(lines)


def main(argv=None) -> None:
    t0 = time.perf_counter()
    args = parse_args(argv)
    if args.child:
        return child(args.child, args.result_file, t0)
    if args.prepare:
        return prepare(args.prepare, args.result_file)
    if args.generation:
        return generation(args.generation, args.result_file)
    os.chdir(ROOT)
    if args.model is not None:
        workloads = model_workloads(args)
    else:
        workloads = [parse_workload(n) for n in args.workloads] if args.workloads else list(DEFAULT_WORKLOADS)
    machine = machine_info(ROOT)
    print(f"machine: {machine['cpu_model']}, {machine['logical_cpus']} CPUs, {machine['ram_gib']} GiB, "
          f"load {machine['load_average_at_start']}", flush=True)
    peaks: list[float] = []
    if args.model is not None:  # used as it is; the phase tables show generation
        checkpoints = {workloads[0].size: {"checkpoint": workloads[0].model}}
        gen = {}
        from bench_flops import Shape, matmul_peak

        peaks.append(matmul_peak())  # this process is idle while the children run: the same core's peak
    else:
        checkpoints = prepare_checkpoints({w.size for w in workloads})
        gen = {} if args.no_generation else generation_comparison(workloads, checkpoints)
    runs = []
    util: dict = {}
    started = datetime.datetime.now()
    out = Path(args.out) if args.out else HERE / "results" / f"grpo_vs_trl-{started:%Y%m%d-%H%M%S}.json"
    out.parent.mkdir(parents=True, exist_ok=True)

    def save(summary=None, text=None):  # after every run, so an interrupted run keeps what it measured
        out.write_text(json.dumps({
            "started": started.isoformat(timespec="seconds"),
            "complete": summary is not None,
            "args": {k: v for k, v in vars(args).items() if k not in ("child", "prepare", "generation", "result_file")},
            "machine": machine,
            "models": checkpoints,
            "summary": summary,
            "generation": gen,
            "matmul_peak_gflops": peaks,
            "utilisation": util,
            "table_markdown": text,
            "runs": runs,
        }, indent=1, default=str))

    for rep in range(args.reps):
        order = args.frameworks[rep % len(args.frameworks):] + args.frameworks[: rep % len(args.frameworks)]
        for w in workloads:
            for fw in order:
                steps = args.steps_5m if w.size == "5m" and w.model is None else args.steps
                run = run_one(fw, w, checkpoints[w.size]["checkpoint"], steps, args.timeout)
                run["rep"] = rep
                runs.append(run)
                save()
                if run["ok"]:
                    kept = [s["step_s"] for s in run["per_step"][args.discard:]]
                    print(f"rep {rep} {w.name:22s} {fw:5s} median {statistics.median(kept):.3f} s/step, "
                          f"peak RSS {run['peak_rss_mib']:.0f} MiB, setup {run['setup_s']:.1f} s, "
                          f"load {load_average()[0]}", flush=True)
                    phases = run_figures(run, args.discard)["phases"]
                    print("    " + ", ".join(f"{k} {v:.2f}" for k, v in phases.items() if v is not None), flush=True)
    summary = summarise(runs, workloads, args.frameworks, args.discard)
    machine["load_average_at_end"] = load_average()
    if peaks:
        from transformers import AutoConfig

        peaks.append(matmul_peak())
        util.update(utilisation(summary, runs, workloads, Shape.of(AutoConfig.from_pretrained(args.model)), max(peaks)))
    text = table(summary) + generation_table(gen) + utilisation_table(util)
    print("\n" + text)
    save(summary, text)
    print(f"\nresults: {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")


if __name__ == "__main__":
    main()
