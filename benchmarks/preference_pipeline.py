"""The RLHF pipeline on SmolLM2, measured: does a reward model learned from preference pairs, and DPO on the same pairs,
raise a gold score the training never saw?

    OMP_NUM_THREADS=1 python benchmarks/preference_pipeline.py --out benchmarks/results
    python benchmarks/preference_pipeline.py --smoke            # the harness on the recipe's smoke settings

Runs `experiments/smollm2_rlhf.py` (samples -> rm -> grpo, and dpo on the same pairs) in this process (LocalRuntime,
no Aim, one thread) and writes `preference_pipeline-<time>.json` into `--out` (default: a temporary folder) with:

- `rm_heldout_accuracy`: the reward model's accuracy on the held-out pairs (never trained on), with a 95% interval;
- `gold_base`, `gold_rl_with_rm`, `gold_dpo`: the gold rule's score (fraction of answers that open by naming their
  subject) of the instruct model, after GRPO against the learned reward model alone, and after DPO, on the held-out
  prompts (greedy, every one of the recipe's test-split prompts), each with a 95% interval;
- `length_only_heldout_accuracy`: how often "the longer answer is better" (and, separately, "the shorter") picks the
  chosen answer of a held-out pair (a tie counts half), i.e. whether length alone could have labelled the pairs;
- `proxy_vs_gold`: the GRPO run's curve, per step the reward model's mean score (the proxy it climbs) beside the gold
  rule's mean on the same samples, and the held-out gold at each validation: over-optimisation shows as the
  proxy rising while the gold falls;
- `stage_minutes` (each stage's wall time, validation included), the targets and whether each was met.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from scratch import report_pruned  # noqa: E402  logs stay, checkpoints go
from transfer import CurveTracker, wilson  # noqa: E402  (set_params, the context manager, hash)

GOLD = "val-core/direct_answer/reward/mean@1"
TARGETS = {"rm_heldout_accuracy": 0.80, "gold_gain_rl": 0.15, "gold_gain_dpo": 0.10, "length_only_at_most": 0.60,
           "stage_minutes_at_most": 20.0}


class StageCurves(CurveTracker):
    """A tracker that keeps each stage's logged metrics in memory, with the wall time each stage started."""

    curves: dict[str, list[dict]] = {}
    started: dict[str, float] = {}
    current = ""

    def start_run(self, stage: str, **lineage) -> StageCurves:
        StageCurves.current = stage
        StageCurves.started[stage] = time.perf_counter()
        StageCurves.curves.setdefault(stage, [])
        return self

    def track(self, metrics: Mapping[str, float], step: int) -> None:
        point = {"step": step, **{k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}}
        StageCurves.curves[StageCurves.current].append(point)
        shown = {k: round(v, 4) for k, v in point.items() if k in ("step", "reward/model/mean", "reward/rule/mean",
                 "rm/accuracy", "rewards/accuracies", "timing_s/step", GOLD)}
        print(StageCurves.current, json.dumps(shown), flush=True)


def length_only_accuracy(pairs: list[dict]) -> dict[str, float]:
    """How often the longer (and the shorter) answer of a pair is its chosen one, by characters; a tie counts half."""
    from rlhf.data.preferences import length_sides, longer_chosen_share

    share = longer_chosen_share(pairs) or 0.0
    return {"longer_is_chosen": round(share, 4), "shorter_is_chosen": round(1 - share, 4),
            "tied_pairs": length_sides(pairs).count(None), "pairs": len(pairs)}


def scored(fraction: float, n: int) -> dict[str, Any]:
    return {"value": round(fraction, 4), "ci95": [round(x, 4) for x in wilson(fraction, n)], "n": n}


def graph_commands(recipe_args: str = "", smoke: bool = False, threads: int = 1) -> list[str]:
    """The recipe's commands: local, quiet, every stage's workers on `threads` torch threads."""
    return [f"config:base({recipe_args})", "fiddler:local", "fiddler:quiet", f"fiddler:threads(n={threads})"] + (
        ["fiddler:smoke"] if smoke else [])


def run(recipe_args: str, smoke: bool, out: Path, run_name: str | None = None, threads: int = 1) -> dict[str, Any]:
    """The recipe's graph, local and untracked, every stage in order, each worker on `threads` torch threads
    (`fiddler:threads`); the measured fields."""
    import fiddle as fdl
    import torch

    torch.set_num_threads(threads)
    from rlhf.cli.experiment import build_graph, load_experiment
    from rlhf.runtime.experiment import run_experiment

    recipe = load_experiment(str(ROOT / "experiments" / "smollm2_rlhf.py"))
    commands = graph_commands(recipe_args, smoke, threads)
    graph, _ = build_graph(recipe, commands)
    graph.tracker = fdl.Config(StageCurves)
    graph.output_dir = str(out)
    graph.run_name = run_name  # named: a rerun skips the stages it finished (their minutes are not re-measured)
    heldout = len(fdl.build(graph.stages["grpo"].evaluator.dataset).rows) if not smoke else None
    started = time.perf_counter()
    results = run_experiment(graph)
    finished = time.perf_counter()
    stages = list(graph.stages)
    ran = [s for s in stages if s in StageCurves.started]
    ends = [StageCurves.started[s] for s in ran[1:]] + [finished]
    minutes = {s: round((end - StageCurves.started[s]) / 60, 2) for s, end in zip(ran, ends)}

    generations = results["samples"]["generations"] if "samples" in results else graph.stages["rm"].data.rows.generations
    heldout_pairs = recipe.labelled_pairs(generations, "test")
    grpo_curve = StageCurves.curves.get("grpo", [])
    validations = [p for p in grpo_curve if GOLD in p]
    n = heldout or 1
    rm_accuracy = results["rm"]["metrics"].get("rm/accuracy", float("nan"))
    gold = {"base": validations[0][GOLD] if validations else float("nan"), "rl": results["grpo"]["metrics"][GOLD], "dpo": results["dpo"]["metrics"][GOLD]}
    return {
        "rm_heldout_accuracy": round(rm_accuracy, 4),
        "rm_heldout_accuracy_ci95": [round(x, 4) for x in wilson(rm_accuracy, len(heldout_pairs) or 1)],
        "rm_heldout_pairs": len(heldout_pairs),
        "gold_base": round(gold["base"], 4), "gold_rl_with_rm": round(gold["rl"], 4), "gold_dpo": round(gold["dpo"], 4),
        "gold": {k: scored(v, n) for k, v in gold.items()},
        "heldout_prompts": heldout,
        "length_only_heldout_accuracy": length_only_accuracy(heldout_pairs),
        "dpo_heldout_pairs": {k: round(v, 4) for k, v in results["dpo"]["metrics"].items() if k.startswith("val/")},
        "proxy_vs_gold": [{k: round(p[k], 4) for k in ("step", "reward/model/mean", "reward/rule/mean", GOLD,
                                                       "actor/ppo_kl", "actor/kl_loss") if k in p} for p in grpo_curve],
        "dpo_curve": [{k: round(v, 4) for k, v in p.items() if k in ("step", "rewards/accuracies", "rewards/margins",
                       "rewards/chosen", "rewards/rejected", GOLD)} for p in StageCurves.curves.get("dpo", [])],
        "rm_curve": [{k: round(v, 4) for k, v in p.items() if k in ("step", "rm_loss", "rm/accuracy", "rm/margin")}
                     for p in StageCurves.curves.get("rm", [])],
        "stage_minutes": minutes, "wall_minutes": round((finished - started) / 60, 1),
    }


def verdict(result: dict[str, Any]) -> dict[str, bool]:
    length = result["length_only_heldout_accuracy"]
    return {
        "rm_accuracy_at_least_0.80": result["rm_heldout_accuracy"] >= TARGETS["rm_heldout_accuracy"],
        "rl_gold_gain_at_least_15_points": result["gold_rl_with_rm"] - result["gold_base"] >= TARGETS["gold_gain_rl"],
        "dpo_gold_gain_at_least_10_points": result["gold_dpo"] - result["gold_base"] >= TARGETS["gold_gain_dpo"],
        "length_only_at_most_60pct": max(length["longer_is_chosen"], length["shorter_is_chosen"])
        <= TARGETS["length_only_at_most"],
        "every_stage_within_20_min": all(m <= TARGETS["stage_minutes_at_most"]
                                         for m in result["stage_minutes"].values()),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="folder for the JSON (default: a temporary folder)")
    parser.add_argument("--recipe-args", default="", help='arguments of the recipe\'s base(), e.g. \'model="/path"\' '
                        "or 'dpo_lr=1e-5' (recorded in the JSON)")
    parser.add_argument("--smoke", action="store_true", help="the recipe's smoke settings (a harness check, seconds)")
    parser.add_argument("--note", default="", help="a sentence kept in the JSON (e.g. where reused samples came from)")
    parser.add_argument("--workdir", default=None, help="the run's folder (default: a new temporary folder)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of every stage (fiddler:threads); "
                        "more than one only on an otherwise idle machine")
    parser.add_argument("--run-name", default=None, help="name the run: run again with the same --workdir and "
                        "name, it skips the stages it finished")
    args = parser.parse_args()
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="preference_pipeline-"))
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix=f"preference_pipeline-{stamp}-"))
    load_before = os.getloadavg()
    result = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "recipe": f"experiments/smollm2_rlhf.py base({args.recipe_args})" + (" fiddler:smoke" if args.smoke else ""),
        "model": "SmolLM2-135M-Instruct, fp32, CPU", "targets": TARGETS, "note": args.note,
        **run(args.recipe_args, args.smoke, workdir, args.run_name, args.threads),
    }
    result["verdict"] = verdict(result)
    result.update({
        "load_average": {"before": [round(x, 2) for x in load_before], "after": [round(x, 2) for x in os.getloadavg()]},
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {args.threads} thread(s) per stage",
        "threads": args.threads, "command": " ".join(sys.argv),
        "run_folder": str(workdir),
    })
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"preference_pipeline-{stamp}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    if not args.workdir:  # a folder the caller named is theirs to keep
        report_pruned(workdir)
    print(json.dumps({k: result[k] for k in ("rm_heldout_accuracy", "gold_base", "gold_rl_with_rm", "gold_dpo")}))
    print(json.dumps(result["verdict"]))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
