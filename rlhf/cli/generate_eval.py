"""`rlhf generate MODEL --data FILE --out FILE`, `rlhf eval ...` and `rlhf probe ...`: the flags, the graph, the run.

The graphs come from `rlhf_configs.generate_eval` (plain experiments), built from the inputs (MODEL,
--data, --generations, --out, --engine, --scorer); every knob flag is an alias of the `set:` override
`--help` shows beside it (`generation_flags`, `rlhf.cli.graph_flags`), and any other `set:` or `fiddler:`
word may follow. This module parses the flags (defaults from the graph builders' signatures, read from
their source), checks what it can before any model loads (numbers, the scorers and the data sources they
must cover: `rlhf.cli.job_inputs`), runs the graphs, and prints where results went. The graphs and the
checks are imported once the flags are parsed, so `--help` imports neither torch nor the runtimes.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence

from rlhf.argtypes import POSITIVE, OneLineParser as _Parser, number as _number
from rlhf.cli.graph_flags import GraphFlag, HelpFormatter, add_graph_flags, apply_graph_flags, split_overrides
from rlhf.cli.source_defaults import source_defaults

__all__ = ["eval_graph", "eval_main", "generate_graph", "generate_main", "generation_flags", "load_scorer",
           "probe_graph", "probe_main"]

STAGE = {"generate": "stages.generate", "eval": "stages.eval.generation", "probe": "stages.probe.generation"}
"""Each command's GenerationStage in its graph (`rlhf eval` has one only when it generates: MODEL --data)."""


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


def generation_flags(d: dict, g: str, sampling: bool = True, needs: str = "") -> tuple[GraphFlag, ...]:
    """The knob flags of a GenerationStage at path `g` (`STAGE`); `d`: the builder's defaults, for --help;
    `sampling`: with --n, --temperature, --top-p (not `rlhf probe`: greedy, one response per prompt)."""
    worker = f"{g}.policy.worker"
    engine = f"the vLLM engine's context ({worker}.engine...max_model_len) is raised to prompt + new tokens"
    flags = [GraphFlag("--limit", (f"{g}.dataset.rows.limit",), "use the first N prompts of --data only", d["limit"],
                       POSITIVE, needs=needs)]
    if sampling:
        flags += [
            GraphFlag("--n", (f"{g}.sampling.n",), "responses per prompt", d["n"], POSITIVE, needs=needs),
            GraphFlag("--temperature", (f"{g}.sampling.temperature",), "0 is greedy", d["temperature"],
                      _number(float, 0), needs=needs),
            GraphFlag("--top-p", (f"{g}.sampling.top_p",), "nucleus sampling", d["top_p"],
                      _number(float, 0, 1, low_open=True), needs=needs),
        ]
    return (*flags,
        GraphFlag("--max-new-tokens", (f"{g}.sampling.max_new_tokens",), f"response length limit; {engine}",
                  d["max_new_tokens"], POSITIVE, needs=needs),
        GraphFlag("--batch-size", (f"{g}.prompts_per_call",), "prompts per generate call, all workers (progress and "
                  "appends come once per call); None: 64 responses per worker", d["batch_size"], POSITIVE, needs=needs),
        GraphFlag("--max-prompt-length", (f"{g}.dataset.max_prompt_length",), f"longer prompts are skipped; {engine}",
                  d["max_prompt_length"], POSITIVE, needs=needs),
        GraphFlag("--workers", (f"{g}.policy.num_workers",), "data-parallel policy workers (Ray)", d["workers"],
                  POSITIVE, needs=needs),
        GraphFlag("--gpus-per-worker", (f"{g}.policy.gpus_per_worker",), "per policy worker", d["gpus_per_worker"],
                  _number(float, 0), needs=needs),
        GraphFlag("--dtype", (f"{worker}.dtype", f"{g}.dtype"), "the policy's weights (recorded in each row)",
                  d["dtype"], choices=["float32", "bfloat16", "float16"], needs=needs,
                  where_set=(f"{worker}.engine.dtype", f"{worker}.engine.vllm.dtype")),
    )


def _sampling_parser(prog: str, builder: str, sampling: bool = True, more: Callable[[dict], tuple] = lambda d: ()):
    """The parser of `rlhf generate`, `rlhf eval` and `rlhf probe`: the inputs they share, the knob flags of
    their GenerationStage (`generation_flags`), the run options; defaults come from the signature of `builder`
    (a function of `rlhf_configs.generate_eval`), and `more(defaults)`'s. Returns (parser, knob flags)."""
    d = source_defaults("rlhf_configs.generate_eval", builder)
    command = prog.split()[-1]
    flags = (*generation_flags(d, STAGE[command], sampling, needs="MODEL --data FILE" if command == "eval" else ""),
             *more(d))
    p = _Parser(prog=prog, formatter_class=HelpFormatter,
                usage=f"{prog} ... [options] [set:PATH=VALUE ...] [fiddler:NAME ...]")
    inputs = p.add_argument_group("inputs (they decide which nodes the graph has)")
    inputs.add_argument("--data", help="prompts: .parquet / .jsonl / .json rows in verl's schema")
    inputs.add_argument("--engine", default=d["engine"], choices=["auto", "hf", "vllm"],
                        help="rollout engine: transformers (hf) or vLLM; auto: vLLM on a GPU where installed, else hf")
    inputs.add_argument("--scorer", action="append", default=[], metavar="[DATA_SOURCE=]MODULE:FUNCTION",
                        help="score responses with FUNCTION(response, ground_truth, extra_info) -> float | dict: every "
                             "data source,\nor only DATA_SOURCE (repeat the flag for several); see "
                             "docs/generate_and_eval.md")
    add_graph_flags(p, flags)
    run = p.add_argument_group("run options (not graph knobs)")
    run.add_argument("--local", action="store_true", help="run in this process (LocalRuntime), not on Ray")
    run.add_argument("--aim-repo", default=None, help="record the run in this Aim repo (None: no tracking)")
    run.add_argument("--quiet", action="store_true", help="no progress bar")
    return p, flags


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


def _run_options(args) -> dict:
    return dict(engine=args.engine, local=args.local, aim_repo=args.aim_repo, progress=not args.quiet)


def _with_flags(p, graph, args, flags, overrides):
    """The graph with the knob flags and the `set:`/`fiddler:` words, its vLLM context fitted to its lengths."""
    from rlhf_configs.generate_eval import fit_engine_context

    graph = apply_graph_flags(p, graph, args, flags, overrides)
    return fit_engine_context(graph, keep_longer=any("max_model_len" in str(word) for word in overrides))


def generate_graph(argv: Sequence[str]):
    """(the graph `rlhf generate ARGV` runs, the parsed flags, the scorers): `generation_experiment` of the inputs,
    then the knob flags as their `set:` overrides, then the command line's `set:`/`fiddler:` words."""
    p, flags = _sampling_parser("rlhf generate", "generation_experiment")
    p.add_argument("model", help="model folder (e.g. a checkpoint .../final), PEFT adapter folder "
                                 "(.../final-adapter) or hub id")
    p.add_argument("--out", required=True, help="output .jsonl (resumable; a .parquet copy is written at the end)")
    argv, overrides = split_overrides(argv)
    args = p.parse_args(argv)
    if not args.data:
        p.error("--data FILE is required")
    scoring = _scorers(p, args.scorer)
    from rlhf_configs.generate_eval import generation_experiment

    graph = generation_experiment(args.model, args.data, args.out, **_run_options(args), **scoring)
    return _with_flags(p, graph, args, flags, overrides), args, scoring


def generate_main(argv: Sequence[str]) -> int:
    """`rlhf generate`: n responses per prompt into a resumable JSON Lines file (and parquet), scored with --scorer."""
    graph, args, scoring = generate_graph(argv)
    from rlhf.cli.job_inputs import check_sources, data_sources, run_job

    if args.scorer:
        check_sources(data_sources(args.data, "generation", graph.stages["generate"].dataset.rows.limit), **scoring)
    result = run_job(graph)["generate"]
    print(f"generations: {result['generations']}\nparquet:     {result['parquet']}")
    if "generate/score/mean" in result["metrics"]:
        print(f"mean score:  {result['metrics']['generate/score/mean']:.4f}")
    if result.get("run_hash"):
        print(f"aim run:     {result['run_hash']}")
    return 0


def _ints(text: str) -> tuple[int, ...]:
    """An argparse type: comma-separated positive integers (--ks, --budgets)."""
    try:
        values = tuple(int(k) for k in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if min(values) < 1:
        raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
    return values


def eval_graph(argv: Sequence[str]):
    """(the graph `rlhf eval ARGV` runs, the parsed flags, the scorers), as `generate_graph`."""
    p, flags = _sampling_parser("rlhf eval", "eval_experiment", more=lambda d: (
        GraphFlag("--ks", ("stages.eval.ks",), "comma-separated k of pass@k / maj@k", ",".join(map(str, d["ks"])),
                  _ints),
        GraphFlag("--n-boot", ("stages.eval.n_boot",), "bootstrap resamples for the intervals", d["n_boot"],
                  _number(int, 0)),
        GraphFlag("--seed", ("stages.eval.seed",), "for the bootstrap and maj@k subsets", d["seed"], int)))
    p.add_argument("model", nargs="?", help="generate with this model first (with --data)")
    p.add_argument("--generations", help="score this file from `rlhf generate` instead of generating")
    p.add_argument("--out", default=None, help="folder for eval_results.json, the plot (and generations); "
                   "None: outputs/eval/<time>/eval, not resumable")
    argv, overrides = split_overrides(argv)
    args = p.parse_args(argv)
    if (args.generations is None) == (args.model is None):
        p.error("give either --generations FILE, or MODEL with --data FILE")
    if args.model is not None and not args.data:
        p.error("MODEL needs --data FILE (the prompts to generate for)")
    scoring = _scorers(p, args.scorer)
    from rlhf_configs.generate_eval import eval_experiment

    graph = eval_experiment(args.generations, args.model, args.data, args.out, **_run_options(args), **scoring)
    return _with_flags(p, graph, args, flags, overrides), args, scoring


def eval_main(argv: Sequence[str]) -> int:
    """`rlhf eval`: score a generations file, or generate with MODEL first; mean@n, pass@k, maj@k per data source."""
    graph, args, scoring = eval_graph(argv)
    from rlhf.cli.job_inputs import check_sources, data_sources, generation_sources, run_job

    if args.generations is not None:
        check_sources(generation_sources(args.generations), **scoring)
    else:
        check_sources(data_sources(args.data, "prompt", graph.stages["eval"].generation.dataset.rows.limit), **scoring)
    result = run_job(graph)["eval"]
    if result.get("run_hash"):
        print(f"aim run: {result['run_hash']}")
    return 0


def probe_graph(argv: Sequence[str]):
    """(the graph `rlhf probe ARGV` runs, the parsed flags, the scorers), as `generate_graph`."""
    p, flags = _sampling_parser("rlhf probe", "probe_experiment", sampling=False, more=lambda d: (
        GraphFlag("--budgets", ("stages.probe.budgets",), "comma-separated max_new_tokens values: the share of "
                  "responses each would cut", ",".join(map(str, d["budgets"])), _ints),
        GraphFlag("--samples", ("stages.probe.samples",), "K: also sample K responses per row at --temperature and "
                  "report pass@K and the share of rows whose samples score differently (what GRPO learns from); 0: "
                  "greedy only", d["samples"], _number(int, 0)),
        GraphFlag("--temperature", ("stages.probe.temperature",), "the sampled responses' temperature (training's)",
                  d["temperature"], _number(float, 0, low_open=True)),
        GraphFlag("--samples-max-new-tokens", ("stages.probe.samples_max_new_tokens",), "the sampled responses' "
                  "length limit (training's budget); None: --max-new-tokens", d["samples_max_new_tokens"], POSITIVE),
    ))
    p.add_argument("model", help="model folder (e.g. a checkpoint .../final) or hub id")
    p.add_argument("--out", default=None, help="the JSON report (the generations go beside it, "
                   "<name>.generations.jsonl, resumable); None: outputs/probe/<time>/probe/probe.json")
    argv, overrides = split_overrides(argv)
    args = p.parse_args(argv)
    if not args.data:
        p.error("--data FILE is required (rows with a ground truth, e.g. from `rlhf data prepare`)")
    scoring = _scorers(p, args.scorer)
    from rlhf_configs.generate_eval import probe_experiment

    graph = probe_experiment(args.model, args.data, args.out, **_run_options(args), **scoring)
    graph = _with_flags(p, graph, args, flags, overrides)
    budgets, new_tokens = graph.stages["probe"].budgets, graph.stages["probe"].generation.sampling.max_new_tokens
    if max(budgets) >= new_tokens:
        print(f"note: --max-new-tokens {new_tokens} does not exceed the largest budget {max(budgets)}: "
              "what it cuts is measured only as a lower bound", file=sys.stderr)
    return graph, args, scoring


def probe_main(argv: Sequence[str]) -> int:
    """`rlhf probe`: greedy accuracy, answer lengths and what each token budget would cut, before training."""
    graph, args, scoring = probe_graph(argv)
    from rlhf.cli.job_inputs import check_sources, data_sources, run_job

    check_sources(data_sources(args.data, "prompt", graph.stages["probe"].generation.dataset.rows.limit), **scoring)
    run_job(graph)
    return 0
