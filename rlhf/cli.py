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
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    command, rest = argv[0], argv[1:]
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
    if command in ("generate", "eval"):
        return {"generate": generate_main, "eval": eval_main}[command](rest)
    sys.exit(f"error: unknown command {command!r}\n\n{USAGE}")


# ------------------------------------------------------------ rlhf generate / rlhf eval
# The graphs of the two commands. They are fiddle graphs, so they are built up here at the
# top layer (components under rlhf/ never import fiddle); both are plain experiments that
# run_experiment runs like any other.


def _generation_stage(model, data, out, *, n, temperature, top_p, max_new_tokens, batch_size,
                      max_prompt_length, workers, gpus_per_worker, dtype, parent_run):
    import fiddle as fdl

    from rlhf.data.prompts import PromptDataset
    from rlhf.data.sources import load_rows
    from rlhf.models.loading import load_tokenizer
    from rlhf.rollout.sampling import SamplingParams
    from rlhf.trainers.generate import GenerationStage
    from rlhf_configs.pieces import policy_group

    tokenizer = fdl.Config(load_tokenizer, model)
    return fdl.Config(
        GenerationStage,
        policy=policy_group(num_workers=workers, gpus_per_worker=gpus_per_worker, model_path=model, dtype=dtype),
        dataset=fdl.Config(PromptDataset, rows=fdl.Config(load_rows, path=data), tokenizer=tokenizer,
                           max_prompt_length=max_prompt_length, name="generate"),
        sampling=fdl.Config(SamplingParams, n=n, temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens),
        output=out,
        batch_size=batch_size,
        parent_run=parent_run,
    )


def _root(name, stage, *, local, aim_repo, progress=True):
    import fiddle as fdl

    from rlhf.runtime.experiment import Experiment
    from rlhf.runtime.local import LocalRuntime
    from rlhf.runtime.ray_runtime import RayRuntime
    from rlhf.tracking.aim_tracker import AimTracker

    return fdl.Config(
        Experiment,
        name=name,
        stages={name: stage},
        runtime=fdl.Config(LocalRuntime if local else RayRuntime),
        tracker=fdl.Config(AimTracker, repo=aim_repo, experiment=name) if aim_repo else None,
        progress=progress,
    )


def _parent(aim_repo, path, param="checkpoint"):
    """The Aim run that wrote `path` (a trainer's checkpoint, a generations file), if tracked."""
    if not aim_repo or path is None or not Path(path).exists():
        return None
    from rlhf.trainers.eval_job import producer_run

    return producer_run(aim_repo, path, param)


def generation_experiment(
    model: str, data: str, out: str, n: int = 1, temperature: float = 1.0, top_p: float = 1.0,
    max_new_tokens: int = 512, batch_size: int = 64, max_prompt_length: int = 1024, workers: int = 1,
    gpus_per_worker: float = 0, dtype: str = "float32", local: bool = False, aim_repo: str | None = None,
    progress: bool = True,
):
    """`rlhf generate`: one GenerationStage over `data` with `model` (linked to the run that trained it)."""
    stage = _generation_stage(
        model, data, out, n=n, temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens,
        batch_size=batch_size, max_prompt_length=max_prompt_length, workers=workers,
        gpus_per_worker=gpus_per_worker, dtype=dtype, parent_run=_parent(aim_repo, model),
    )
    return _root("generate", stage, local=local, aim_repo=aim_repo, progress=progress)


def eval_experiment(
    generations: str | None = None, model: str | None = None, data: str | None = None, out: str | None = None,
    ks: tuple[int, ...] = (1, 2, 4, 8), n: int = 8, temperature: float = 1.0, top_p: float = 1.0,
    max_new_tokens: int = 512, batch_size: int = 64, max_prompt_length: int = 1024, workers: int = 1,
    gpus_per_worker: float = 0, dtype: str = "float32", n_boot: int = 1000, seed: int = 0,
    local: bool = False, aim_repo: str | None = None, progress: bool = True,
):
    """`rlhf eval`: an EvalJob over a generations file, or over `model` x `data` (generated first,
    into `<out>/generations.jsonl`, resumable). Scored with `default_scorers()`."""
    import fiddle as fdl

    from rlhf.rewards import RewardManager, default_scorers
    from rlhf.trainers.eval_job import EvalJob

    if (generations is None) == (model is None or data is None):
        raise ValueError("give either generations=FILE, or model=MODEL and data=FILE")
    generation = None
    if generations is None:
        generation = _generation_stage(
            model, data, None if out is None else str(Path(out) / "generations.jsonl"), n=n,
            temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens, batch_size=batch_size,
            max_prompt_length=max_prompt_length, workers=workers, gpus_per_worker=gpus_per_worker,
            dtype=dtype, parent_run=None,
        )
    stage = fdl.Config(
        EvalJob,
        reward=fdl.Config(RewardManager, scorers=fdl.Config(default_scorers)),
        generations=generations,
        generation=generation,
        ks=tuple(ks),
        out_dir=out,
        n_boot=n_boot,
        seed=seed,
        parent_run=_parent(aim_repo, model) if model else _parent(aim_repo, generations, "generations"),
    )
    return _root("eval", stage, local=local or generation is None, aim_repo=aim_repo, progress=progress)


def _sampling_parser(prog: str, n: int):
    import argparse

    p = argparse.ArgumentParser(prog=prog)
    p.add_argument("--data", help="prompts: .parquet / .jsonl / .json rows in verl's schema")
    p.add_argument("--n", type=int, default=n, help=f"responses per prompt (default {n})")
    p.add_argument("--temperature", type=float, default=1.0, help="0 is greedy (default 1.0)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--max-new-tokens", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=64, help="prompts per generate call, over all workers")
    p.add_argument("--max-prompt-length", type=int, default=1024, help="longer prompts are skipped (tokens)")
    p.add_argument("--workers", type=int, default=1, help="data-parallel policy workers (Ray)")
    p.add_argument("--gpus-per-worker", type=float, default=0)
    p.add_argument("--dtype", default="float32", help="float32, bfloat16 or float16")
    p.add_argument("--local", action="store_true", help="run in this process (LocalRuntime), not on Ray")
    p.add_argument("--aim-repo", default=None, help="record the run in this Aim repo (default: no tracking)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def _common(args) -> dict:
    return dict(n=args.n, temperature=args.temperature, top_p=args.top_p, max_new_tokens=args.max_new_tokens,
                batch_size=args.batch_size, max_prompt_length=args.max_prompt_length, workers=args.workers,
                gpus_per_worker=args.gpus_per_worker, dtype=args.dtype, local=args.local,
                aim_repo=args.aim_repo, progress=not args.quiet)


def generate_main(argv: Sequence[str]) -> int:
    p = _sampling_parser("rlhf generate", n=1)
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
    p = _sampling_parser("rlhf eval", n=8)
    p.add_argument("model", nargs="?", help="generate with this model first (with --data)")
    p.add_argument("--generations", help="score this file from `rlhf generate` instead of generating")
    p.add_argument("--ks", default="1,2,4,8", help="comma-separated k of pass@k / maj@k (default 1,2,4,8)")
    p.add_argument("--out", default=None, help="folder for eval_results.json, the plot (and generations)")
    p.add_argument("--n-boot", type=int, default=1000, help="bootstrap resamples for the confidence intervals")
    p.add_argument("--seed", type=int, default=0)
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
