"""`rlhf generate MODEL --data FILE --out FILE` and `rlhf eval ...`: the flags, the graph, the run.

The graphs come from `rlhf_configs.generate_eval` (plain experiments); this module parses the
flags (defaults from the graph builders' signatures), runs them, and prints where results went.
"""

from __future__ import annotations

import argparse
import inspect
import sys
from collections.abc import Sequence

from rlhf.runtime.experiment import run_experiment
from rlhf.runtime.preflight import PreflightError
from rlhf_configs.generate_eval import eval_experiment, generation_experiment

__all__ = ["eval_main", "generate_main"]


def _sampling_parser(prog: str, builder):
    """The flags shared by `rlhf generate` and `rlhf eval`; defaults come from `builder`'s signature."""
    d = {name: p.default for name, p in inspect.signature(builder).parameters.items()}
    p = argparse.ArgumentParser(prog=prog, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--data", help="prompts: .parquet / .jsonl / .json rows in verl's schema")
    p.add_argument("--n", type=int, default=d["n"], help="responses per prompt")
    p.add_argument("--temperature", type=float, default=d["temperature"], help="0 is greedy")
    p.add_argument("--top-p", type=float, default=d["top_p"], help="nucleus sampling")
    p.add_argument("--max-new-tokens", type=int, default=d["max_new_tokens"], help="response length limit")
    p.add_argument("--batch-size", type=int, default=d["batch_size"], help="prompts per generate call, all workers")
    p.add_argument("--max-prompt-length", type=int, default=d["max_prompt_length"], help="longer prompts are skipped")
    p.add_argument("--workers", type=int, default=d["workers"], help="data-parallel policy workers (Ray)")
    p.add_argument("--gpus-per-worker", type=float, default=d["gpus_per_worker"], help="per policy worker")
    p.add_argument("--dtype", default=d["dtype"], help="float32, bfloat16 or float16")
    p.add_argument("--engine", default=d["engine"], choices=["auto", "hf", "vllm"],
                   help="rollout engine: transformers (hf) or vLLM; auto: vLLM on a GPU where installed, else hf")
    p.add_argument("--local", action="store_true", help="run in this process (LocalRuntime), not on Ray")
    p.add_argument("--aim-repo", default=None, help="record the run in this Aim repo (None: no tracking)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p, d


def _common(args) -> dict:
    return dict(n=args.n, temperature=args.temperature, top_p=args.top_p, max_new_tokens=args.max_new_tokens,
                batch_size=args.batch_size, max_prompt_length=args.max_prompt_length, workers=args.workers,
                gpus_per_worker=args.gpus_per_worker, dtype=args.dtype, engine=args.engine, local=args.local,
                aim_repo=args.aim_repo, progress=not args.quiet)


def generate_main(argv: Sequence[str]) -> int:
    p, _ = _sampling_parser("rlhf generate", generation_experiment)
    p.add_argument("model", help="model folder (e.g. a checkpoint .../final), PEFT adapter folder (.../final-adapter) or hub id")
    p.add_argument("--out", required=True, help="output .jsonl (resumable; a .parquet copy is written at the end)")
    args = p.parse_args(argv)
    if not args.data:
        p.error("--data FILE is required")
    result = _run(generation_experiment(args.model, args.data, args.out, **_common(args)))["generate"]
    print(f"generations: {result['generations']}\nparquet:     {result['parquet']}")
    if result.get("run_hash"):
        print(f"aim run:     {result['run_hash']}")
    return 0


def eval_main(argv: Sequence[str]) -> int:
    p, d = _sampling_parser("rlhf eval", eval_experiment)
    p.add_argument("model", nargs="?", help="generate with this model first (with --data)")
    p.add_argument("--generations", help="score this file from `rlhf generate` instead of generating")
    ks = ",".join(map(str, d["ks"]))
    p.add_argument("--ks", default=ks, help="comma-separated k of pass@k / maj@k")
    p.add_argument("--out", default=None, help="folder for eval_results.json, the plot (and generations); "
                   "None: outputs/eval/<time>/eval, not resumable")
    p.add_argument("--n-boot", type=int, default=d["n_boot"], help="bootstrap resamples for the intervals")
    p.add_argument("--seed", type=int, default=d["seed"], help="for the bootstrap and maj@k subsets")
    args = p.parse_args(argv)
    if (args.generations is None) == (args.model is None):
        p.error("give either --generations FILE, or MODEL with --data FILE")
    if args.model is not None and not args.data:
        p.error("MODEL needs --data FILE (the prompts to generate for)")
    try:
        ks = tuple(int(k) for k in args.ks.split(","))
    except ValueError:
        p.error(f"--ks must be comma-separated integers, got {args.ks!r}")
    graph = eval_experiment(args.generations, args.model, args.data, args.out, ks=ks, n_boot=args.n_boot,
                            seed=args.seed, **_common(args))
    result = _run(graph)["eval"]
    if result.get("run_hash"):
        print(f"aim run: {result['run_hash']}")
    return 0


def _run(graph) -> dict:
    """run_experiment, with bad input (missing model or data, bad rows) as one error message."""
    try:
        return run_experiment(graph)
    except PreflightError as err:
        sys.exit(f"error: {err}")
