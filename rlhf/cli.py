"""The `rlhf` command: `rlhf run|plan|show EXPERIMENT.py [--config ...]`, `rlhf data prepare ...`."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path

USAGE = """usage: rlhf COMMAND ...

  rlhf run  experiments/x.py [--config CMD ...]   run an experiment (same as python experiments/x.py)
  rlhf plan experiments/x.py [--config CMD ...]   print each stage's execution plan
  rlhf show experiments/x.py [--config CMD ...]   print the graph after overrides, and where each value was set
  rlhf diff A B [--config CMD ...]                what differs between two experiments, JSON graphs or Aim runs
  rlhf viz  experiments/x.py --out DIR            each stage graph as SVG (Graphviz) and the Plan as text
  rlhf rerun RUN_HASH [--repo .aim] [--local]     run the graph an Aim run stored again
  rlhf ui [--repo .aim] [--port N]                Aim's UI on loopback, with a link to the latest sweep
  rlhf data prepare TASK --out DIR                write a dataset in verl's schema
  rlhf export CKPT OUT                            a training checkpoint -> Hugging Face model folder
  rlhf rollouts show STAGE_DIR [--step N]         print recorded rollouts (best/worst per group)
  rlhf generate MODEL --data FILE --out FILE      n responses per prompt (resumable JSON Lines + parquet)
  rlhf eval --generations FILE [--ks 1,2,4,8]     score generations: mean@n, pass@k, maj@k per data source
  rlhf eval MODEL --data FILE --n 8 [--out DIR]   generate, then score
"""


def load_experiment(path: str):
    file = Path(path)
    if not file.is_file():
        sys.exit(f"error: no experiment file {path!r} (e.g. experiments/arithmetic_tiny.py)")
    sys.path.insert(0, str(file.resolve().parent.parent))  # the project root, for rlhf_configs
    spec = importlib.util.spec_from_file_location(file.stem, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[file.stem] = module
    spec.loader.exec_module(module)
    return module


def main(argv: Sequence[str] | None = None) -> int:
    from rlhf.config.cli import honour_interrupts

    honour_interrupts()
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    command, rest = argv[0], argv[1:]
    if command == "serve":  # rlhf serve MODEL [--host --port --api-key ...]: an OpenAI-compatible server
        from rlhf.serve import main as serve

        return serve(rest)
    if command == "data":
        if not rest or rest[0] != "prepare":
            sys.exit("usage: rlhf data prepare TASK --out DIR")
        from rlhf.data.prepare import main as prepare

        return prepare(rest[1:])
    if command == "export":
        if len(rest) != 2:
            sys.exit("usage: rlhf export CKPT OUT")
        from rlhf.trainers.export import export_checkpoint

        print(export_checkpoint(rest[0], rest[1]))
        return 0
    if command == "rollouts":
        import argparse

        from rlhf.trainers.records import format_records, read_records

        p = argparse.ArgumentParser(prog="rlhf rollouts show")
        p.add_argument("action", choices=["show"])
        p.add_argument("stage_dir", help="a stage folder: <output_dir>/<experiment>/<run>/<stage>")
        p.add_argument("--step", type=int, default=None)
        a = p.parse_args(rest)
        try:
            print(format_records(read_records(a.stage_dir, a.step)))
        except FileNotFoundError as err:
            sys.exit(f"error: {err}")
        return 0
    if command in ("run", "plan", "show"):
        if not rest:
            sys.exit(f"usage: rlhf {command} experiments/x.py [--config CMD ...]")
        from rlhf.config.cli import run_cli

        extra = {"plan": ["--print_plan"], "show": ["--print_graph"], "run": []}[command]
        run_cli(load_experiment(rest[0]), rest[1:] + extra)
        return 0
    if command in ("diff", "viz", "rerun", "ui"):  # provenance and comparison: rlhf/config/commands.py
        from rlhf.config.commands import main as config_command

        return config_command(command, rest)
    if command == "sft":  # rlhf sft MODEL --data FILE [--val FILE --steps --batch-size --lr --out --local]
        from rlhf_configs.sft import main as sft

        return sft(rest)
    if command in ("generate", "eval"):
        return {"generate": generate_main, "eval": eval_main}[command](rest)
    sys.exit(f"error: unknown command {command!r}\n\n{USAGE}")


from rlhf_configs.generate_eval import eval_experiment, generation_experiment  # noqa: E402


def _sampling_parser(prog: str, builder):
    """The flags shared by `rlhf generate` and `rlhf eval`; defaults come from `builder`'s signature."""
    import argparse
    import inspect

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
    p.add_argument("model", help="model folder (e.g. a checkpoint .../final) or hub id")
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
    from rlhf.config.validate import PreflightError
    from rlhf.runtime.experiment import run_experiment

    try:
        return run_experiment(graph)
    except PreflightError as err:
        sys.exit(f"error: {err}")


if __name__ == "__main__":
    sys.exit(main())
