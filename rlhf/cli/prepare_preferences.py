"""`rlhf data prepare preferences --model M --data PROMPTS --scorer SCORER --samples N --out DIR`.

Labels preference pairs offline: the model answers every prompt N times (`rlhf generate`'s stage,
resumable, into DIR/generations.jsonl), the scorer ranks the answers, and each prompt's best and
worst answers become one pair (chosen, rejected) in DIR/train.parquet and DIR/test.parquet. A prompt
whose answers all score the same gives no pair (counted). The scorer is a rule (a data_source of
`rlhf.rewards.RULES`, e.g. `arithmetic`; `rules`: each row's own data_source's rule) or any
`module:function` called as `function(response, ground_truth, extra_info) -> float | dict`, so a
rule or a judge can label data.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

from rlhf.argtypes import POSITIVE, OneLineParser, number
from rlhf.cli.source_defaults import source_defaults

__all__ = ["prepare_preferences_main"]

RULES_OF_EACH_ROW = "rules"
"""--scorer value: score each row with its own data_source's built-in rule."""


def _parser() -> OneLineParser:
    d = source_defaults("rlhf_configs.generate_eval", "generation_experiment")
    p = OneLineParser(prog="rlhf data prepare preferences",
                      description="Sample a model on prompts, rank the samples with a scorer, write (best, worst) "
                                  "pairs as DIR/train.parquet and DIR/test.parquet (docs/preferences.md).")
    p.add_argument("--model", required=True, help="model folder that answers the prompts")
    p.add_argument("--data", required=True, help="prompts: .parquet / .jsonl / .json rows in verl's schema")
    p.add_argument("--scorer", default=RULES_OF_EACH_ROW, metavar="RULE|[DATA_SOURCE=]MODULE:FUNCTION",
                   help=f"ranks the samples: a built-in rule's data_source (e.g. arithmetic), "
                        f"'{RULES_OF_EACH_ROW}' (each row's own rule), or module:function(response, ground_truth, "
                        "extra_info) -> float | dict")
    p.add_argument("--samples", type=number(int, 2), default=4, help="answers per prompt (>= 2)")
    p.add_argument("--out", required=True, type=Path, help="output folder (created if missing)")
    p.add_argument("--test-fraction", type=number(float, 0, 1), default=0.1, help="share of pairs held out")
    p.add_argument("--seed", type=int, default=0, help="for the train/test split")
    p.add_argument("--with-margin", action="store_true", help="store each pair's score difference as its margin")
    p.add_argument("--length-matched", action="store_true",
                   help="among tied best and tied worst answers, pair the two closest in length (less length bias)")
    p.add_argument("--length-balanced", action="store_true",
                   help="among tied best and tied worst answers, balance over the data set how often the chosen one "
                        "is the longer, so length alone labels about half the pairs (implies --length-matched)")
    p.add_argument("--limit", type=POSITIVE, default=None, help="use the first N prompts only")
    p.add_argument("--temperature", type=number(float, 0, low_open=True), default=1.0, help="sampling temperature")
    p.add_argument("--top-p", type=number(float, 0, 1, low_open=True), default=d["top_p"])
    p.add_argument("--max-new-tokens", type=POSITIVE, default=d["max_new_tokens"])
    p.add_argument("--max-prompt-length", type=POSITIVE, default=d["max_prompt_length"], help="longer prompts skipped")
    p.add_argument("--batch-size", type=POSITIVE, default=d["batch_size"], help="prompts per generate call")
    p.add_argument("--dtype", default=d["dtype"], choices=["float32", "bfloat16", "float16"])
    p.add_argument("--engine", default=d["engine"], choices=["auto", "hf", "vllm"])
    p.add_argument("--workers", type=POSITIVE, default=d["workers"], help="data-parallel policy workers (Ray)")
    p.add_argument("--local", action="store_true", help="run in this process (LocalRuntime), not on Ray")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def scorer_arguments(spec: str) -> dict:
    """`scorer`/`scorers` of `generation_experiment` for a --scorer value; ValueError naming the choices."""
    from rlhf.cli.generate_eval import load_scorer
    from rlhf.rewards.registry import SCORERS, rule_key

    if spec == RULES_OF_EACH_ROW:
        return {}
    if ":" in spec:
        source, scorer = load_scorer(spec)
        return {"scorer": scorer} if source is None else {"scorers": {source: scorer}}
    key = rule_key(SCORERS, spec)
    if key is None:
        raise ValueError(f"--scorer {spec!r}: no built-in rule of that name (rules: {', '.join(sorted(SCORERS))}); "
                         f"or give module:function, or '{RULES_OF_EACH_ROW}'")
    return {"scorer": SCORERS[key]}


def split_pairs(pairs: list[dict], test_fraction: float, seed: int) -> tuple[list[dict], list[dict]]:
    """(train, test): a seeded random `test_fraction` of the pairs held out, each part in the input order."""
    import numpy as np

    n_test = round(len(pairs) * test_fraction)
    test = set(np.random.default_rng(seed).permutation(len(pairs))[:n_test].tolist())
    return ([p for i, p in enumerate(pairs) if i not in test], [p for i, p in enumerate(pairs) if i in test])


def score_samples(generated: list[dict], scoring: dict) -> list[list[float]]:
    """Each generated row's scores, one per response, from the reward manager `scoring` describes."""
    from rlhf.data.schema import ground_truth, has_ground_truth
    from rlhf.rewards import RewardManager, scorers_with

    manager = RewardManager(scorers_with(scoring.get("scorers"), builtin=scoring.get("scorer") is None),
                            default=scoring.get("scorer"))
    flat = [(row, text) for row in generated for text in row["responses"]]
    out = manager([text for _, text in flat], [row["data_source"] for row, _ in flat],
                  [ground_truth(row) if has_ground_truth(row) else None for row, _ in flat],
                  [row.get("extra_info") or {} for row, _ in flat])
    scores, start = [], 0
    for row in generated:
        scores.append([float(x) for x in out.scores[start : start + len(row["responses"])]])
        start += len(row["responses"])
    return scores


def prepare_preferences_main(argv: Sequence[str]) -> int:
    """Generate, rank, pair, write; prints what was written and how many prompts tied."""
    p = _parser()
    a = p.parse_args(argv)
    try:
        scoring = scorer_arguments(a.scorer)
    except ValueError as err:
        p.error(str(err))
    from rlhf.cli.job_inputs import check_sources, data_sources, run_job
    from rlhf.data.preferences import longer_chosen_share, preference_pairs, write_preference_rows
    from rlhf_configs.generate_eval import generation_experiment

    check_sources(data_sources(a.data, "generation", a.limit), scoring.get("scorer"), scoring.get("scorers"))
    a.out.mkdir(parents=True, exist_ok=True)
    # generated without a scorer and scored here: a rerun with another scorer relabels the same samples
    result = run_job(generation_experiment(
        a.model, a.data, str(a.out / "generations.jsonl"), n=a.samples, temperature=a.temperature, top_p=a.top_p,
        max_new_tokens=a.max_new_tokens, batch_size=a.batch_size, max_prompt_length=a.max_prompt_length,
        workers=a.workers, dtype=a.dtype, local=a.local, progress=not a.quiet, engine=a.engine, limit=a.limit,
    ))["generate"]
    with open(result["generations"], encoding="utf-8") as f:
        generated = [json.loads(line) for line in f if line.strip()]
    scores = score_samples(generated, scoring)
    pairs = preference_pairs(generated, scores, with_margin=a.with_margin, length_matched=a.length_matched,
                             length_balanced=a.length_balanced)
    ties = sum(pair is None for pair in pairs)
    pairs = [pair for pair in pairs if pair is not None]
    if not pairs:
        sys.exit(f"error: every prompt's {a.samples} answers scored the same ({ties} prompts): no pairs. Fix: more "
                 "--samples, a higher --temperature, or a scorer that tells the answers apart.")
    train, test = split_pairs(pairs, a.test_fraction, a.seed)
    for name, part in (("train", train), ("test", test)):
        if part:
            path = write_preference_rows(part, a.out / f"{name}.parquet")
            print(f"wrote {len(part)} pairs to {path}")
        else:  # not a stale file from an earlier run
            (a.out / f"{name}.parquet").unlink(missing_ok=True)
    gap = sum(p["extra_info"]["chosen_score"] - p["extra_info"]["rejected_score"] for p in pairs) / len(pairs)
    print(f"{len(generated)} prompts x {a.samples} samples: {len(pairs)} pairs, {ties} prompts dropped (all samples "
          f"tied); mean score gap chosen - rejected {gap:.3f}; the longer answer is the chosen one in "
          f"{longer_chosen_share(pairs):.1%} of the pairs (length alone labels that many right; 50% is none)")
    return 0
