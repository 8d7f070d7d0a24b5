"""`rlhf generate MODEL --data FILE --out FILE`, `rlhf eval ...` and `rlhf probe ...`: the flags, the graph, the run.

The graphs come from `rlhf_configs.generate_eval` (plain experiments); this module parses the
flags (defaults from the graph builders' signatures, read from their source), checks what it can
before any model loads (numbers, the scorers and the data sources they must cover:
`rlhf.cli.job_inputs`), runs them, and prints where results went. The graphs and the checks are
imported once the flags are parsed, so `--help` imports neither torch nor the runtimes.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence

from rlhf.argtypes import POSITIVE, OneLineParser as _Parser, number as _number
from rlhf.cli.source_defaults import source_defaults

__all__ = ["eval_main", "generate_main", "load_scorer", "probe_main"]


def load_scorer(spec: str) -> tuple[str | None, Callable]:
    """`module:function` or `DATA_SOURCE=module:function` -> (data_source or None for every source, the function).

    Raises ValueError with what is wrong (not importable, no such function, not callable)."""
    source, _, target = spec.rpartition("=") if "=" in spec.split(":", 1)[0] else ("", "", spec)
    module_name, _, name = target.partition(":")
    if not module_name or not name:
        raise ValueError(f"--scorer {spec!r}: expected module:function or DATA_SOURCE=module:function, e.g. "
                         "my_rewards:last_number")
    if os.getcwd() not in sys.path:  # as `python -m` does: a my_rewards.py beside the data imports
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"--scorer {spec!r}: cannot import module {module_name!r} ({err}); put it in the current "
                         "folder or on PYTHONPATH, or install it") from err
    scorer = getattr(module, name, None)
    if scorer is None:
        raise ValueError(f"--scorer {spec!r}: module {module_name!r} ({module.__file__}) has no {name!r}")
    if not callable(scorer):
        raise ValueError(f"--scorer {spec!r}: {module_name}.{name} is a {type(scorer).__name__}, not a function")
    return source or None, scorer


def _sampling_parser(prog: str, builder: str, sampling: bool = True):
    """The flags shared by `rlhf generate`, `rlhf eval` and (without the `sampling` ones: it is greedy, one
    response per prompt) `rlhf probe`; defaults come from the signature of `builder` (a function of
    `rlhf_configs.generate_eval`)."""
    d = source_defaults("rlhf_configs.generate_eval", builder)
    p = _Parser(prog=prog, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--data", help="prompts: .parquet / .jsonl / .json rows in verl's schema")
    p.add_argument("--limit", type=POSITIVE, default=d["limit"], help="use the first N prompts of --data only")
    if sampling:
        p.add_argument("--n", type=POSITIVE, default=d["n"], help="responses per prompt")
        p.add_argument("--temperature", type=_number(float, 0), default=d["temperature"], help="0 is greedy")
        p.add_argument("--top-p", type=_number(float, 0, 1, low_open=True), default=d["top_p"],
                       help="nucleus sampling")
    p.add_argument("--max-new-tokens", type=POSITIVE, default=d["max_new_tokens"], help="response length limit")
    p.add_argument("--batch-size", type=POSITIVE, default=d["batch_size"],
                   help="prompts per generate call, all workers (progress and appends come once per call); "
                        "None: 64 responses per worker")
    p.add_argument("--max-prompt-length", type=POSITIVE, default=d["max_prompt_length"],
                   help="longer prompts are skipped")
    p.add_argument("--workers", type=POSITIVE, default=d["workers"], help="data-parallel policy workers (Ray)")
    p.add_argument("--gpus-per-worker", type=_number(float, 0), default=d["gpus_per_worker"], help="per policy worker")
    p.add_argument("--dtype", default=d["dtype"], choices=["float32", "bfloat16", "float16"])
    p.add_argument("--engine", default=d["engine"], choices=["auto", "hf", "vllm"],
                   help="rollout engine: transformers (hf) or vLLM; auto: vLLM on a GPU where installed, else hf")
    p.add_argument("--scorer", action="append", default=[], metavar="[DATA_SOURCE=]MODULE:FUNCTION",
                   help="score responses with FUNCTION(response, ground_truth, extra_info) -> float | dict: every "
                        "data source, or only DATA_SOURCE (repeat the flag for several); see docs/generate_and_eval.md")
    p.add_argument("--local", action="store_true", help="run in this process (LocalRuntime), not on Ray")
    p.add_argument("--aim-repo", default=None, help="record the run in this Aim repo (None: no tracking)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p, d


def _scorers(p: argparse.ArgumentParser, specs: Sequence[str]) -> dict:
    """`scorer` (every data source) and `scorers` (per data source) for the graph builders, from --scorer flags."""
    everywhere, per_source = None, {}
    for spec in specs:
        try:
            source, scorer = load_scorer(spec)
        except ValueError as err:
            p.error(str(err))
        if source is None:
            if everywhere is not None:
                p.error(f"--scorer {spec!r}: a scorer for every data source was already given; name a data "
                        "source (DATA_SOURCE=module:function) for the others")
            everywhere = scorer
        else:
            per_source[source] = scorer
    return {"scorer": everywhere, "scorers": per_source or None}


def _common(args, sampling: bool = True) -> dict:
    common = dict(max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
                  max_prompt_length=args.max_prompt_length, workers=args.workers, gpus_per_worker=args.gpus_per_worker,
                  dtype=args.dtype, engine=args.engine, local=args.local, aim_repo=args.aim_repo,
                  progress=not args.quiet, limit=args.limit)
    return {**common, **(dict(n=args.n, temperature=args.temperature, top_p=args.top_p) if sampling else {})}


def generate_main(argv: Sequence[str]) -> int:
    """`rlhf generate`: n responses per prompt into a resumable JSON Lines file (and parquet), scored with --scorer."""
    p, _ = _sampling_parser("rlhf generate", "generation_experiment")
    p.add_argument("model", help="model folder (e.g. a checkpoint .../final), PEFT adapter folder (.../final-adapter) or hub id")
    p.add_argument("--out", required=True, help="output .jsonl (resumable; a .parquet copy is written at the end)")
    args = p.parse_args(argv)
    if not args.data:
        p.error("--data FILE is required")
    scoring = _scorers(p, args.scorer)
    from rlhf.cli.job_inputs import check_sources, data_sources, run_job
    from rlhf_configs.generate_eval import generation_experiment

    if args.scorer:
        check_sources(data_sources(args.data, "generation", args.limit), **scoring)
    result = run_job(generation_experiment(args.model, args.data, args.out, **_common(args), **scoring))["generate"]
    print(f"generations: {result['generations']}\nparquet:     {result['parquet']}")
    if "generate/score/mean" in result["metrics"]:
        print(f"mean score:  {result['metrics']['generate/score/mean']:.4f}")
    if result.get("run_hash"):
        print(f"aim run:     {result['run_hash']}")
    return 0


def eval_main(argv: Sequence[str]) -> int:
    """`rlhf eval`: score a generations file, or generate with MODEL first; mean@n, pass@k, maj@k per data source."""
    p, d = _sampling_parser("rlhf eval", "eval_experiment")
    p.add_argument("model", nargs="?", help="generate with this model first (with --data)")
    p.add_argument("--generations", help="score this file from `rlhf generate` instead of generating")
    ks = ",".join(map(str, d["ks"]))
    p.add_argument("--ks", default=ks, help="comma-separated k of pass@k / maj@k")
    p.add_argument("--out", default=None, help="folder for eval_results.json, the plot (and generations); "
                   "None: outputs/eval/<time>/eval, not resumable")
    p.add_argument("--n-boot", type=_number(int, 0), default=d["n_boot"], help="bootstrap resamples for the intervals")
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
    if min(ks) < 1:
        p.error(f"--ks must be positive, got {args.ks!r}")
    scoring = _scorers(p, args.scorer)
    from rlhf.cli.job_inputs import check_sources, data_sources, generation_sources, run_job
    from rlhf_configs.generate_eval import eval_experiment

    if args.generations is not None:
        check_sources(generation_sources(args.generations), **scoring)
    else:
        check_sources(data_sources(args.data, "prompt", args.limit), **scoring)
    graph = eval_experiment(args.generations, args.model, args.data, args.out, ks=ks, n_boot=args.n_boot,
                            seed=args.seed, **_common(args), **scoring)
    result = run_job(graph)["eval"]
    if result.get("run_hash"):
        print(f"aim run: {result['run_hash']}")
    return 0


def probe_main(argv: Sequence[str]) -> int:
    """`rlhf probe`: greedy accuracy, answer lengths and what each token budget would cut, before training."""
    p, d = _sampling_parser("rlhf probe", "probe_experiment", sampling=False)
    p.add_argument("model", help="model folder (e.g. a checkpoint .../final) or hub id")
    p.add_argument("--budgets", default=",".join(map(str, d["budgets"])),
                   help="comma-separated max_new_tokens values: the share of responses each would cut")
    p.add_argument("--out", default=None, help="the JSON report (the generations go beside it, "
                   "<name>.generations.jsonl, resumable); None: outputs/probe/<time>/probe/probe.json")
    args = p.parse_args(argv)
    if not args.data:
        p.error("--data FILE is required (rows with a ground truth, e.g. from `rlhf data prepare`)")
    try:
        budgets = tuple(int(b) for b in args.budgets.split(","))
    except ValueError:
        p.error(f"--budgets must be comma-separated integers, got {args.budgets!r}")
    if min(budgets) < 1:
        p.error(f"--budgets must be positive, got {args.budgets!r}")
    if max(budgets) >= args.max_new_tokens:
        print(f"note: --max-new-tokens {args.max_new_tokens} does not exceed the largest budget {max(budgets)}: "
              "what it cuts is measured only as a lower bound", file=sys.stderr)
    scoring = _scorers(p, args.scorer)
    from rlhf.cli.job_inputs import check_sources, data_sources, run_job
    from rlhf_configs.generate_eval import probe_experiment

    check_sources(data_sources(args.data, "prompt", args.limit), **scoring)
    run_job(probe_experiment(args.model, args.data, args.out, budgets=budgets, **_common(args, sampling=False),
                             **scoring))
    return 0
