"""The memory planner against measurement: predicted vs measured peak per role and phase, over a grid of shapes.

    python benchmarks/memory_plan.py                       # the tiny model; SmolLM2 too with --smollm2
    python benchmarks/memory_plan.py --smollm2 --out benchmarks/results/memory_plan.json
    python benchmarks/memory_plan.py --device cuda --out DIR/memory_plan-cuda.json   # one GPU (scripts/gpu_check.sh)

Each grid point runs in fresh processes (two for 2 FSDP ranks, over gloo), builds the real workers
(the policy with its reference model and the transformers engine, a critic, a reward model) on the
model folder, runs one warm-up step, then measures the second step's phases: generation, the
no-grad log-prob (value, score) forward, and the update. Measured is the peak of live tensor bytes
(`rlhf.workers.memory_probe.PeakMemory`: a dispatch mode tracking storages on CPU,
`torch.cuda.max_memory_allocated` on a GPU), which includes the weights, gradients and optimizer
state alive during the phase, as the prediction does. Predicted is each worker's `predict_memory`
for the same settings. The grid (issue 27): the tiny model and SmolLM2-135M, 2-3 token budgets,
gradient checkpointing on and off, 1 and 2 FSDP ranks, 2 generation batch sizes. Prints a table
and one JSON object (--out writes it); exits non-zero when a prediction is off by more than --tolerance.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

PROMPT_TOKENS, RESPONSE_TOKENS, N = 48, 16, 4


def grid(models: list[str], quick: bool, device: str = "cpu") -> list[dict]:
    """The points: every model x (strategy, ranks) x gradient checkpointing x token budget, and the
    generation batch sizes varied on the first of each. On one GPU: one rank, the tiny model's quick
    points and a Qwen2.5-0.5B-shaped random model in DDP and FSDP, bf16 compute."""
    if device == "cuda":
        tiny = [dict(p, device="cuda", dtype="float32") for p in grid(["tiny"], quick=True)[:2]]
        big = [dict(model="qwen0.5b", strategy=s, ranks=1, checkpointing=c, budget=4096, prompts=8, gen_rows=None,
                    device="cuda", dtype="bfloat16") for s in ("ddp", "fsdp") for c in (False, True)]
        return tiny + big
    points = []
    budgets = {"tiny": [None, 512, 1024], "smollm2": [256, 512]}
    for model in models:
        for (strategy, ranks), ckpt, budget in itertools.product(
            [("ddp", 1), ("fsdp", 1), ("fsdp", 2)], [False, True], budgets[model]
        ):
            points.append(dict(model=model, strategy=strategy, ranks=ranks, checkpointing=ckpt, budget=budget,
                               prompts=4, gen_rows=None))
        for rows in (4, 8):
            points.append(dict(model=model, strategy="ddp", ranks=1, checkpointing=False, budget=budgets[model][-1],
                               prompts=4, gen_rows=rows))
    if quick:
        points = [p for p in points if p["ranks"] == 1][:4]
    return points


def model_path(model: str) -> str:
    if model == "tiny":
        from helpers import tiny_model_path

        return tiny_model_path(hidden_size=64, num_layers=4)
    if model == "qwen0.5b":
        import tempfile

        from rlhf.models.tiny import tiny_qwen2

        return tiny_qwen2(os.path.join(tempfile.gettempdir(), "rlhf-memory-plan-qwen0.5b"), hidden_size=896,
                          num_layers=24, num_heads=14, num_kv_heads=2, intermediate_size=4864, vocab_size=151_936)
    from rlhf.models.importing import import_model

    return str(import_model("smollm2-135m-instruct"))


def reward_model_path(path: str) -> str:
    """`path` with a one-label score head (a copy beside it, made once): the reward-model worker refuses a language
    model whose head would be initialised at random; the head's memory is what the plan counts."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    out = path.rstrip("/") + "-score-head"
    if not os.path.exists(os.path.join(out, "config.json")):
        torch.manual_seed(0)
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1,
                                                                   pad_token_id=tokenizer.pad_token_id)
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
    return out


def worker_arguments(point: dict) -> dict[str, dict]:
    """The workers' keyword arguments at a point (the same dict the prediction reads)."""
    import fiddle as fdl

    from rlhf.algos import KLLoss, PPOClipLoss, kl_k3
    from rlhf.rollout.hf_engine import HFEngine
    from rlhf.workers.objectives import PolicyObjective
    from rlhf.workers.training import TrainingSetup

    path = model_path(point["model"])
    training = TrainingSetup(strategy=point["strategy"], micro_batch_size=4, max_tokens_per_micro_batch=point["budget"],
                             gradient_checkpointing=point["checkpointing"],
                             compute_dtype=point.get("dtype", TrainingSetup().compute_dtype))
    engine = functools.partial(HFEngine, max_rows_per_call=point["gen_rows"]) if point["gen_rows"] else HFEngine
    policy = dict(model_path=path, ref_model_path=path, training=training, engine=engine,
                  objective=PolicyObjective(policy_loss=PPOClipLoss(), kl_loss=KLLoss(estimator=kl_k3, coef=0.1)))
    del fdl
    return {"policy": policy, "critic": dict(model_path=path, training=training),
            "reward_model": dict(model_path=reward_model_path(path), training=training,
                                 max_length=PROMPT_TOKENS + RESPONSE_TOKENS)}


def predictions(point: dict) -> dict[str, dict[str, float]]:
    from rlhf.workers.critic import CriticWorker
    from rlhf.workers.memory import Placement, Workload
    from rlhf.workers.policy import PolicyWorker
    from rlhf.workers.reward_model import RewardModelWorker

    args = worker_arguments(point)
    rows = point["prompts"] * N // point["ranks"]
    workload = Workload(PROMPT_TOKENS, RESPONSE_TOKENS, n=N, rows=rows)
    placement = Placement(point.get("device", "cpu"), point["ranks"], fsdp=point["strategy"] == "fsdp",
                          process_group=True)  # env set
    out = {}
    for role, cls in (("policy", PolicyWorker), ("critic", CriticWorker), ("reward_model", RewardModelWorker)):
        estimate = cls.predict_memory(args[role], workload, placement)  # the signature's defaults fill the rest
        out[role] = {phase.name: phase.bytes for phase in estimate.phases}
    return out


# --------------------------------------------------------------------------- measured (child processes)
def measure(point: dict, rank: int) -> dict[str, dict[str, float]]:
    import torch

    torch.set_num_threads(1)
    from rlhf.batch import Batch
    from rlhf.rollout.sampling import SamplingParams
    from rlhf.workers.critic import CriticWorker
    from rlhf.workers.memory_probe import PeakMemory
    from rlhf.workers.policy import PolicyWorker
    from rlhf.workers.reward_model import RewardModelWorker

    args = worker_arguments(point)
    prompts = point["prompts"] // point["ranks"]
    g = torch.Generator().manual_seed(rank)
    ids = torch.randint(3, 200, (prompts, PROMPT_TOKENS), generator=g)
    mask = torch.ones_like(ids)
    prompt_batch = Batch({"input_ids": ids, "attention_mask": mask, "position_ids": torch.arange(PROMPT_TOKENS)
                          .expand(prompts, -1).contiguous()}, {"uid": [f"p{rank}-{i}" for i in range(prompts)]})
    sampling = SamplingParams(n=N, max_new_tokens=RESPONSE_TOKENS, min_new_tokens=RESPONSE_TOKENS, temperature=1.0)
    out: dict[str, dict[str, float]] = {"policy": {}, "critic": {}, "reward_model": {}}

    def peak(role: str, phase: str, fn):
        with PeakMemory(point.get("device", "cpu")) as m:
            result = fn()
        out[role][phase] = max(out[role].get(phase, 0), m.peak)
        if os.environ.get("MEMORY_PLAN_DEBUG"):
            print(role, phase, "start", m.start / 2**20, "peak", m.peak / 2**20, file=sys.stderr)
        return result

    policy = PolicyWorker(**args["policy"])
    for step in range(2):  # the second step is the steady state (gradients and optimizer state exist)
        batch = peak("policy", "generation", lambda: policy.generate(prompt_batch, sampling))
        batch["advantages"] = torch.randn(len(batch), 1, generator=g) * batch["response_mask"]
        peak("policy", "log-probs (no grad)", lambda: policy.compute_log_probs(batch))
        batch = batch.union(policy.compute_ref_log_probs(batch))
        peak("policy", "update", lambda: policy.update(batch))
        if step == 0:
            out["policy"] = {}
    policy = None  # frees the actor and reference before the critic is built: the worker sits in reference
    release()  # cycles, so only a collection frees it (else its memory is counted in the critic's peaks)
    critic = CriticWorker(**args["critic"])
    batch["returns"] = torch.randn(len(batch), RESPONSE_TOKENS, generator=g)
    for step in range(2):
        values = peak("critic", "values (no grad)", lambda: critic.compute_values(batch))
        peak("critic", "update", lambda: critic.update(batch.union(values)))
        if step == 0:
            out["critic"] = {}
    critic = None
    release()
    scorer = RewardModelWorker(**args["reward_model"])
    conversations = [list(map(int, row)) for row in batch["input_ids"]]
    peak("reward_model", "score (no grad)", lambda: scorer.score_ids(conversations))
    return out


def release() -> None:
    """Free a dropped worker now: its model lives in reference cycles that only the cyclic collector frees."""
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def run_point(point: dict) -> dict[str, dict[str, float]]:
    ranks = point["ranks"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(ranks):
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])), "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port), "RANK": str(rank), "WORLD_SIZE": str(ranks), "LOCAL_RANK": str(rank),
               "LOCAL_WORLD_SIZE": str(ranks)}
        procs.append(subprocess.Popen([sys.executable, __file__, "--child", json.dumps(point), str(rank)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = []
    for proc in procs:
        stdout, stderr = proc.communicate()
        if proc.returncode:
            raise RuntimeError(f"point {point} failed:\n{stderr[-3000:]}")
        results.append(json.loads(stdout.strip().splitlines()[-1]))
    return {role: {phase: max(r[role][phase] for r in results) for phase in results[0][role]} for role in results[0]}


def label(point: dict) -> str:
    return (f"{point['model']} {point['strategy']}x{point['ranks']} ckpt={'on' if point['checkpointing'] else 'off'} "
            f"budget={point['budget'] or 'rows'} gen_rows={point['gen_rows'] or 'all'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smollm2", action="store_true", help="include SmolLM2-135M (loads the real model)")
    parser.add_argument("--only-smollm2", action="store_true", help="SmolLM2 alone")
    parser.add_argument("--quick", action="store_true", help="four single-rank points")
    parser.add_argument("--tolerance", type=float, default=0.15)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cuda: one rank on the GPU, measured with torch.cuda.max_memory_allocated")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(json.loads(args.child[0]), int(args.child[1]))))
        return
    models = ["smollm2"] if args.only_smollm2 else ["tiny"] + (["smollm2"] if args.smollm2 else [])
    rows, worst = [], 0.0
    started = time.time()
    for point in grid(models, args.quick, args.device):
        measured, predicted = run_point(point), predictions(point)
        for role in measured:
            for phase, m in measured[role].items():
                p = predicted[role][phase]
                error = p / m - 1
                worst = max(worst, abs(error))
                rows.append({**point, "role": role, "phase": phase, "measured_bytes": int(m),
                             "predicted_bytes": int(p), "error": round(error, 4)})
                print(f"{label(point):60s} {role:12s} {phase:22s} measured {m / 2**20:9.2f} MiB  predicted "
                      f"{p / 2**20:9.2f} MiB  {error:+.1%}", flush=True)
    result = {"date": time.strftime("%Y-%m-%d %H:%M"), "device": args.device, "tolerance": args.tolerance,
              "prompt_tokens": PROMPT_TOKENS, "response_tokens": RESPONSE_TOKENS, "n": N,
              "max_abs_error": round(worst, 4), "seconds": round(time.time() - started, 1),
              "load_average": list(os.getloadavg()), "rows": rows}
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    if worst > args.tolerance:
        sys.exit(f"a prediction is off by {worst:.1%} (> {args.tolerance:.0%})")


if __name__ == "__main__":
    main()
