"""Where the host memory of a GRPO run goes, phase by phase, on a real model (issue 27, item 4).

    python benchmarks/step_memory.py --model PATH                       # grpo_stage on CPU, 3 steps
    python benchmarks/step_memory.py --model PATH --tokens 64 --max-tokens 4096

The run is `rlhf_configs.tasks.grpo_stage` as a user runs it on a CPU (LocalRuntime, float32,
DDP at world size 1, `cpu.gin`'s settings), on two-digit addition prompts, 16 prompts x 4
samples, every completion forced to `--tokens` new tokens, `--steps` steps, no evaluation,
with the policy worker instrumented (`bench_worker.MemoryPolicyWorker`). Each configuration
runs in a fresh process. Reported per phase (generate, update and its reference log-probs,
forward, backward and optimizer step, the final save):
- the peak resident set size (RSS) and glibc's live heap bytes (`mallinfo2`: what malloc handed out
  and has not had back, which is where torch's CPU tensors live);
- what the worker holds for good: actor and reference weights, gradients, AdamW state;
- the activations each training micro-batch saves for backward (distinct storages, parameters
  excluded), with its rows and width.
RSS minus live heap is memory the allocator keeps after tensors were freed (plus code and mapped
files). Results go to benchmarks/results/step_memory-<time>.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="a model folder (e.g. rlhf models import smollm2-135m-instruct)")
    p.add_argument("--tokens", type=int, default=24, help="new tokens per completion (all forced)")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--micro-batch", type=int, default=None, help="TrainingSetup.micro_batch_size (default: grpo_stage's)")
    p.add_argument("--max-tokens", type=int, default=None,
                   help="TrainingSetup.max_tokens_per_micro_batch (default: grpo_stage's); 0: none")
    p.add_argument("--mini-batches", type=int, default=None, help="TrainingSetup.mini_batches (default: grpo_stage's)")
    p.add_argument("--fused-lm-head", choices=["default", "on", "off"], default="default")
    p.add_argument("--label", default="", help="a name for this configuration in the results")
    p.add_argument("--out", default=None, help="results JSON (default: benchmarks/results/step_memory-<time>.json)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--result-file", default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def graph(args: argparse.Namespace, out_dir: str):
    import fiddle as fdl

    from bench_worker import MemoryPolicyWorker
    from bench_workloads import last_number_score
    from rlhf.data.generators import arithmetic_rows
    from rlhf.runtime.experiment import Experiment
    from rlhf.runtime.local import LocalRuntime
    from rlhf_configs.tasks import grpo_stage

    stage = grpo_stage(args.model, data_dir="", scorers={"arithmetic": last_number_score}, name="arithmetic",
                       max_new_tokens=args.tokens, n=args.samples, prompts_per_step=args.prompts,
                       total_steps=args.steps)
    stage.train_data.rows = fdl.Config(arithmetic_rows, n=2000, seed=0, split="train")
    stage.evaluator, stage.val_before_train, stage.save_freq = None, False, 0
    stage.sampling.min_new_tokens = args.tokens
    policy = stage.policy
    policy.gpus_per_worker = 0  # cpu.gin
    fdl.update_callable(policy.worker, MemoryPolicyWorker)
    training = policy.worker.training
    training.compute_dtype, training.strategy = "float32", "ddp"
    if args.micro_batch is not None:
        training.micro_batch_size = args.micro_batch
    if args.max_tokens is not None:
        training.max_tokens_per_micro_batch = args.max_tokens or None
    if args.mini_batches is not None:
        training.mini_batches = args.mini_batches
    if args.fused_lm_head != "default":
        policy.worker.fused_lm_head = args.fused_lm_head == "on"
    return fdl.Config(Experiment, name="step_memory", stages={"grpo": stage}, runtime=fdl.Config(LocalRuntime),
                      output_dir=out_dir, progress=False)


def child(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(1)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import fiddle as fdl  # noqa: F401  (imports before the baseline sample)

    from bench_memory import PhaseMemory, rss_bytes
    from bench_worker import MemoryPolicyWorker
    from rlhf.runtime.experiment import run_experiment

    baseline = rss_bytes()
    memory = PhaseMemory()
    MemoryPolicyWorker.MEMORY = memory
    step_seconds: list[float] = []
    with memory, tempfile.TemporaryDirectory(prefix="step-memory-") as out_dir:
        cfg = graph(args, out_dir)
        start = time.perf_counter()
        result = run_experiment(cfg)
        seconds = time.perf_counter() - start
        metrics = result["grpo"]["metrics"]
        step_seconds.append(metrics.get("timing_s/step"))
    report = memory.report()
    report.update(
        baseline_rss_gib=round(baseline / 2**30, 3),
        held_gib={k: round(v / 2**30, 3) for k, v in MemoryPolicyWorker.held.items()},
        activations=[{**a, "gib": round(a["bytes"] / 2**30, 3), "largest_gib": round(a["largest"] / 2**30, 3)}
                     for a in MemoryPolicyWorker.activations],
        run_s=round(seconds, 1),
        last_step_s=step_seconds[-1],
        last_step_metrics={k: v for k, v in metrics.items() if k.startswith(("timing_s/", "actor/micro", "perf/"))},
    )
    Path(args.result_file).write_text(json.dumps(report, indent=1))


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.child:
        return child(args)
    from bench_procs import load_average, machine_info

    argv = list(argv if argv is not None else sys.argv[1:])
    with tempfile.TemporaryDirectory(prefix="step-memory-") as tmp:
        result_file = Path(tmp) / "result.json"
        load_before = load_average()
        proc = subprocess.run([sys.executable, __file__, *argv, "--child", "--result-file", str(result_file)],
                              cwd=ROOT, text=True, capture_output=True)
        if proc.returncode != 0 or not result_file.exists():
            sys.exit(f"the run failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
        report = json.loads(result_file.read_text())
    started = datetime.datetime.now()
    out = Path(args.out) if args.out else HERE / "results" / f"step_memory-{started:%Y%m%d-%H%M%S}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    settings = {k: v for k, v in vars(args).items() if k not in ("child", "result_file", "out")}
    record = {"started": started.isoformat(timespec="seconds"), "settings": settings, "load_before": load_before,
              "load_after": load_average(), "machine": machine_info(ROOT), **report}
    runs = json.loads(out.read_text())["runs"] if out.exists() else []
    out.write_text(json.dumps({"runs": [*runs, record]}, indent=1))
    print(summary(record))
    print(f"results: {out}")


def summary(record: dict) -> str:
    lines = [f"{record['settings']['label'] or 'run'}: peak RSS {record['peak_rss_gib']:.2f} GiB, peak live heap "
             f"{record['peak_live_gib']:.2f} GiB, baseline RSS {record['baseline_rss_gib']:.2f} GiB, "
             f"last step {record['last_step_s']:.1f} s", "held: " + ", ".join(f"{k} {v:.2f}" for k, v in record["held_gib"].items()),
             "| phase | peak RSS GiB | peak live GiB | RSS at end | live at end |", "|---|---|---|---|---|"]
    for name, p in record["phases"].items():
        lines.append(f"| {name} | {p['peak_rss']:.2f} | {p['peak_live']:.2f} | {p['rss']:.2f} | {p['live']:.2f} |")
    widest = max(record["activations"], key=lambda a: a["bytes"], default=None)
    if widest:
        lines.append(f"largest micro-batch activations: {widest['gib']:.2f} GiB for {widest['rows']} rows x "
                     f"{widest['width']} columns ({widest['response_width']} response); "
                     f"{len(record['activations'])} micro-batches")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
