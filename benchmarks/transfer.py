"""Does the default recipe transfer? experiments/smollm2_tasks.py, unchanged, on a panel of tasks: base vs trained.

    OMP_NUM_THREADS=1 python benchmarks/transfer.py                       # the panel below, 2 tasks at a time
    python benchmarks/transfer.py --tasks reasoning_gym/aiw,arithmetic --parallel 1 --steps 12
    python benchmarks/transfer.py --tasks 'reasoning_gym/chain_sum={"max_terms": 2}'   # settings as JSON

Each task runs the recipe in a process of its own (LocalRuntime, no Aim, one thread): the instruct model on the
recipe's 200 test rows, then `--steps` GRPO steps (or fewer: the step that spends `--max-train-minutes`, 15 by
default, the issue's budget per task, is the last; the row's `stopped_early` says at which step) validated on 100
rows of their own every 4 steps (and before the first), then the test rows again on the last weights (the recipe's
`test` stage) and on the ones the validations chose (`best/` at `selected_step`: `chosen_*`). Reported per task
(fractions of the test rows, greedy): `base_accuracy` / `trained_accuracy` (strict: right, in the asked-for form),
`base_lenient` / `trained_lenient` (right, format aside), a Wilson 95% interval of the trained accuracy, training
minutes (the steps' own time, validation excluded), steps, the curve (every step's training score and the share of it
that came from the unformatted credit), each validation's answer spread (`top_share` of the most common answer beside
`truth_top_share`, the right answers' own), `answers` (the same for the last weights' test answers) and `collapsed`:
those answers are one answer to nearly every question (the run's collapse rule), which the verdict counts as no gain
whatever the accuracy, and `shortfall`: why the task misses the targets, from those measurements (`shortfall()`:
collapsed, below the base's lenient accuracy, form not learnt, no measurable change, fell, a small gain; caveats:
near the most common answer's score; in runs from before the test stage, a better validation before the last).
Writes `transfer-<time>-seed<seed>.json` (under benchmarks/results only with --out benchmarks/results; by default
into a temporary folder) with top-level `tasks`, the targets and whether each task met them.

The panel's settings were chosen before any training, from `rlhf probe` on 64 held-out rows each, where the base
model is between 5% and 80% lenient; nothing in the recipe was set per task.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import copy
import datetime
import json
import math
import os
import platform
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from scratch import report_pruned  # noqa: E402  logs stay, checkpoints go

from rlhf.trainers.heldout_watch import COLLAPSE  # noqa: E402  the run's collapse alarm: the same threshold

PANEL = [
    "arithmetic",
    'reasoning_gym/basic_arithmetic={"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2}',
    "reasoning_gym/aiw",
    'reasoning_gym/letter_counting={"min_words": 3, "max_words": 5}',
    'reasoning_gym/chain_sum={"min_terms": 2, "max_terms": 2, "max_digits": 2}',
    # one-digit factors have too few distinct questions for 200 held-out rows (54); not screened at 1-2 digits
    'reasoning_gym/products={"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2}',
    'reasoning_gym/gcd={"min_value": 1, "max_value": 20}',
    # values 1-12 have only 70 distinct test questions; 1-30 chosen after that refusal, before any training
    'reasoning_gym/lcm={"min_value": 1, "max_value": 30}',
]
TARGETS = {"min_gain": 0.10, "mean_gain": 0.15, "not_below_base_lenient": True}
TRAIN_MINUTES = 15.0
"""Each task's training budget on this 2-core machine (the stage's `max_train_minutes`)."""


def parse_task(spec: str) -> tuple[str, dict]:
    """"task" or "task={json settings}" -> (task, settings)."""
    task, _, settings = spec.partition("=")
    return task, json.loads(settings) if settings else {}


def split_specs(text: str) -> list[str]:
    """`--tasks`: specs separated by commas (or ';') outside the braces of their JSON settings."""
    specs, depth, current = [], 0, ""
    for char in text:
        depth += {"{": 1, "}": -1}.get(char, 0)
        if char in ",;" and depth == 0:
            specs.append(current)
            current = ""
        else:
            current += char
    return [spec.strip() for spec in [*specs, current] if spec.strip()]


def wilson(p: float, n: int, z: float = 1.96) -> list[float]:
    """Wilson's 95% interval of a proportion `p` over `n` rows."""
    if n == 0:
        return [0.0, 1.0]
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return [round(max(0.0, centre - half), 4), round(min(1.0, centre + half), 4)]


def shortfall(row: dict) -> dict:
    """Why a task's row misses the per-task targets, read from what the run measured (not written by hand).

    `why_not`: each way it misses (empty when it gains 10 points or more, has not collapsed and ends at or above
    the base's lenient accuracy). `caveats`: what qualifies a figure that may meet the target: the answers mostly
    one answer and the accuracy where always giving the most common right answer would put it; the best
    validation well above the last. Rows of older runs without the answer spread get the rules they can.
    """
    base, trained, gain = row["base_accuracy"], row["trained_accuracy"], row["gain"]
    lenient, base_lenient = row["trained_lenient"], row["base_lenient"]
    # the measured weights' test answers; rows of runs before the test stage: their last validation (the test rows)
    answers = row.get("answers") or (row.get("validations") or [{}])[-1]
    top, truth = answers.get("top_share"), answers.get("truth_top_share")
    why, caveats = [], []
    spread = top is not None and truth is not None
    if spread and top >= COLLAPSE > truth:
        why.append(f"collapsed: one answer to {top:.0%} of the held-out questions, right for {truth:.0%} of them: "
                   "the accuracy is that answer's share, not the task learnt")
    elif row.get("collapsed"):
        why.append("collapsed: one answer to nearly every held-out question (the run's alarm)")
    if trained < base_lenient:
        why.append(f"below the base's lenient accuracy: ends at {trained:.1%} strict, where the base model was "
                   f"right format aside in {base_lenient:.1%}")
    if gain < TARGETS["min_gain"] - 1e-9:  # gains are rounded to 4 places; 0.6 - 0.5 is not below 0.1
        low, high = wilson(base, row.get("heldout_rows") or 200)
        if lenient - trained >= TARGETS["min_gain"]:
            why.append(f"form not learnt: right format aside in {lenient:.1%} of the answers, in the asked-for form "
                       f"in {trained:.1%}")
        if trained < low:
            why.append(f"fell: {base:.1%} -> {trained:.1%}, below the base's 95% interval ({low:.1%}-{high:.1%})")
        elif trained <= high:
            why.append(f"no measurable change: {base:.1%} -> {trained:.1%}, within the base's 95% interval "
                       f"({low:.1%}-{high:.1%})")
        else:
            why.append(f"small gain: {100 * gain:+.1f} points, below {100 * TARGETS['min_gain']:.0f}")
    if top is None and not row.get("collapsed"):
        caveats.append("the answers' spread was not recorded (a run from before the collapse rule): a collapse onto "
                       "one answer cannot be ruled out")
    elif spread and 0.5 <= top < COLLAPSE and abs(trained - truth) <= 0.05:
        caveats.append(f"{top:.0%} of the answers are one answer, and {trained:.1%} is about what always giving "
                       f"the most common right answer scores ({truth:.1%})")
    # runs before the test stage reported their last validation, on the test rows; a better one was left behind
    trained_validations = [] if "selected_step" in row else (row.get("validations") or [])[1:]
    best = max(trained_validations or [{}], key=lambda v: v.get("accuracy") or -1.0)
    if (best.get("accuracy") or -1.0) - trained >= 0.05:
        caveats.append(f"best validation at step {best['step']} ({best['accuracy']:.1%}), "
                       f"{100 * (best['accuracy'] - trained):.1f} points above the last (best/ keeps it)")
    return {"met": not why, "why_not": why, "caveats": caveats}


class CurveTracker:
    """A tracker that keeps the RL stage's logged metrics in memory, step by step (the child's run is its only
    run; the evaluation stages' metrics come back in their results)."""

    curve: list[dict] = []
    hash = None
    stage: str | None = None

    def start_run(self, stage: str, **lineage) -> CurveTracker:
        CurveTracker.stage = stage
        return self

    def track(self, metrics: Mapping[str, float], step: int) -> None:
        if CurveTracker.stage != "grpo":
            return
        CurveTracker.curve.append({"step": step, **{k: float(v) for k, v in metrics.items()
                                                    if isinstance(v, (int, float))}})
        point = {k: round(v, 4) for k, v in CurveTracker.curve[-1].items()
                 if k in ("step", "critic/score/mean", "timing_s/step") or k.startswith("val-")
                 and k.endswith("mean@1")}
        print(json.dumps(point), flush=True)

    def set_params(self, params: Mapping) -> None:
        pass

    def __enter__(self) -> CurveTracker:
        return self

    def __exit__(self, *exc) -> bool:
        return False


def collapsed(metrics: Mapping[str, float], source: str) -> bool:
    """An evaluation's answers collapsed onto one: the run's alarm rule (`COLLAPSE`) on its answer spread."""
    top = metrics.get(f"val-aux/{source}/answers/top_share")
    truth = metrics.get(f"val-aux/{source}/answers/truth_top_share")
    return top is not None and truth is not None and top >= COLLAPSE > truth


def spread_of(metrics: Mapping[str, float], source: str) -> dict:
    """An evaluation's answer spread: the most common answer's share, the right answers' own, distinct answers."""
    return {name: round(metrics[key], 4) for name in ("top_share", "truth_top_share", "distinct")
            if (key := f"val-aux/{source}/answers/{name}") in metrics}


def source_of(task: str) -> str:
    return "arithmetic" if task == "arithmetic" else task


def load_recipe():
    """experiments/smollm2_tasks.py, the recipe the panel runs."""
    from rlhf.cli.experiment import load_experiment

    return load_experiment(str(ROOT / "experiments" / "smollm2_tasks.py"))


def recipe_steps() -> int:
    """The recipe's own default step count (`base(steps=...)`): the panel's default, decided in one place."""
    import inspect

    return inspect.signature(load_recipe().base).parameters["steps"].default


def panel_graph(task: str, settings: dict, steps: int, out: Path, recipe_args: str = "", seed: int = 0,
                overrides: tuple[str, ...] = (), minutes: float | None = None):
    """The recipe's graph for one task: local, untracked, its GRPO stage trained with `seed` (prompt order and
    sampling; the rows, held-out ones included, stay the same), for at most `minutes` of training (the stage's
    time budget: the step that spends it is the last) and `overrides` (`set:` commands, e.g.
    "set:stages.grpo.prompts_per_step=16") applied after it."""
    import fiddle as fdl

    from rlhf.cli.experiment import build_graph

    recipe = load_recipe()
    commands = [f"config:base(task={task!r}, settings={settings!r}, steps={steps}{recipe_args})", "fiddler:local",
                "fiddler:quiet", f"set:stages.grpo.seed={seed}", f"set:stages.grpo.max_train_minutes={minutes}", *overrides]
    graph, _ = build_graph(recipe, commands)
    # the weights the validations chose (best/) on the test rows too, beside the last ones: what choosing would change
    chosen = copy.deepcopy(graph.stages["test"])
    chosen.policy.worker.model_path.key = "selected_checkpoint"
    graph.stages["test_chosen"] = chosen
    graph.tracker = fdl.Config(CurveTracker)
    graph.output_dir = str(out)
    return graph


def run_task(task: str, settings: dict, steps: int, out: Path, recipe_args: str = "", seed: int = 0,
             overrides: tuple[str, ...] = (), minutes: float | None = None) -> dict:
    """One task, in this process (`panel_graph`); returns the task's row of the panel."""
    import torch

    torch.set_num_threads(1)
    from rlhf.runtime.experiment import run_experiment

    graph = panel_graph(task, settings, steps, out, recipe_args, seed, overrides, minutes)
    source = source_of(task)
    strict, lenient = f"val-core/{source}/reward/mean@1", f"val-aux/{source}/lenient/mean@1"
    started = time.perf_counter()
    results = run_experiment(graph)
    result = results["grpo"]
    wall = time.perf_counter() - started
    validations = [p for p in CurveTracker.curve if strict in p]
    base, trained, chosen = (results[stage]["metrics"] for stage in ("base", "test", "test_chosen"))

    def count(stage: str) -> int | None:
        """The rows a stage's evaluator asks its generator for (through a wrapper such as `with_instruction`)."""
        rows = graph.stages[stage].evaluator.dataset.rows
        while not hasattr(rows, "n") and hasattr(rows, "rows"):
            rows = rows.rows
        return rows.n if hasattr(rows, "n") else None

    rows = count("test")
    train_s = sum(p.get("timing_s/step", 0.0) for p in CurveTracker.curve)
    partial = f"reward/extra/{source}/partial/mean"
    row = {
        "task": task, "settings": settings, "seed": seed, "overrides": list(overrides), "heldout_rows": rows,
        "validation_rows": count("grpo"),
        # test rows (held out, looked at only here): the instruct model, and the last weights (the recipe's test)
        "base_accuracy": round(base[strict], 4), "trained_accuracy": round(trained[strict], 4),
        "base_lenient": round(base[lenient], 4), "trained_lenient": round(trained[lenient], 4),
        "ci95": wilson(trained[strict], rows or 200),
        "gain": round(trained[strict] - base[strict], 4),
        # the last weights' test answers: one answer to nearly every question (the alarm's rule), the gain is
        # that answer's share, not the task learnt
        "collapsed": collapsed(trained, source),
        "answers": spread_of(trained, source),
        # the weights the validations chose (best/, its step) on the same test rows: what choosing would change
        "selected_step": (result.get("best") or {}).get("step"),
        "chosen_accuracy": round(chosen[strict], 4), "chosen_lenient": round(chosen[lenient], 4),
        "chosen_gain": round(chosen[strict] - base[strict], 4), "chosen_collapsed": collapsed(chosen, source),
        "chosen_answers": spread_of(chosen, source),
        "train_minutes": round(train_s / 60, 2), "wall_minutes": round(wall / 60, 2),
        "steps": sum(1 for p in CurveTracker.curve if "timing_s/step" in p),
        # the budget ended training before `steps` (the step it did so at), else None
        "stopped_early": (result.get("stopped_early") or {}).get("step"),
        "curve": [{"step": p["step"], "score": round(p["critic/score/mean"], 4),
                   "partial_share": round(p[partial], 4) if partial in p else None,
                   "response_length": round(p.get("response_length/mean", 0.0), 1),
                   "step_s": round(p.get("timing_s/step", 0.0), 1), "gen_s": round(p.get("timing_s/gen", 0.0), 1),
                   "log_prob_s": round(p.get("timing_s/old_log_prob", 0.0), 1),
                   "update_s": round(p.get("timing_s/update_actor", 0.0), 1),
                   "longest_response": round(p.get("response_length/max", 0.0)),
                   **({"rounds": int(p["train/num_gen_batches"]),
                       "groups_with_variance": int(p["dynamic_sampling/groups_with_variance"])}
                      if "train/num_gen_batches" in p else {})}
                  for p in CurveTracker.curve if "critic/score/mean" in p],
        "validations": [{"step": p["step"], "accuracy": round(p[strict], 4), "lenient": round(p.get(lenient, 0), 4),
                         **{name: round(p[f"val-aux/{source}/answers/{name}"], 4)
                            for name in ("top_share", "truth_top_share", "distinct", "collapsed")
                            if f"val-aux/{source}/answers/{name}" in p},
                         **({"clip_ratio": round(p[clip], 4)} if (clip := f"val-aux/{source}/response_length/"
                                                                            "clip_ratio") in p else {})}
                        for p in validations],
    }
    return {**row, "shortfall": shortfall(row)}


def child(spec: str, steps: int, out: Path, recipe_args: str = "", seed: int = 0, overrides: tuple[str, ...] = (),
          minutes: float | None = None) -> int:
    task, settings = parse_task(spec)
    row = run_task(task, settings, steps, out, recipe_args, seed, overrides, minutes)
    print("RESULT " + json.dumps(row), flush=True)
    return 0


def spawn(spec: str, steps: int, workdir: Path, recipe_args: str = "", seed: int = 0,
          overrides: tuple[str, ...] = (), minutes: float | None = None) -> dict:
    """Run one task in a fresh process (its log beside the results); its row, or the error."""
    name = spec.split("=")[0].replace("/", "_")
    log = workdir / f"{name}.log"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                                                          os.environ.get("PYTHONPATH")]))}
    with open(log, "w") as f:
        done = subprocess.run([sys.executable, __file__, "--child", spec, "--steps", str(steps),
                               "--workdir", str(workdir / name), "--recipe-args", recipe_args, "--seed", str(seed),
                               "--max-train-minutes", str(minutes or 0),
                               *[f"--set={o}" for o in overrides]], stdout=f, stderr=subprocess.STDOUT, env=env)
    results = [line[len("RESULT "):] for line in log.read_text().splitlines() if line.startswith("RESULT ")]
    if done.returncode or not results:
        tail = log.read_text().strip().splitlines()[-5:]
        return {"task": spec.split("=")[0], "error": tail, "log": str(log)}
    row = json.loads(results[-1])
    print(f"{row['task']:40s} {100 * row['base_accuracy']:5.1f}% -> {100 * row['trained_accuracy']:5.1f}% strict, "
          f"lenient {100 * row['base_lenient']:5.1f}% -> {100 * row['trained_lenient']:5.1f}%, "
          f"{row['train_minutes']:.1f} min", flush=True)
    return row


def overrides(args: argparse.Namespace) -> tuple[str, ...]:
    """--set PATH=VALUE flags as set: commands."""
    return tuple(o if o.startswith("set:") else f"set:{o}" for o in args.set)


def verdict(rows: list[dict]) -> dict:
    ok = [r for r in rows if "error" not in r]
    gains = [r["gain"] for r in ok]
    return {
        "tasks_run": len(ok), "tasks_failed": len(rows) - len(ok),
        "mean_gain": round(sum(gains) / len(gains), 4) if gains else None,
        # the validation-chosen weights' mean gain on the same test rows: what choosing would change
        "mean_gain_chosen": round(sum(r["chosen_gain"] for r in ok) / len(ok), 4)
        if ok and all("chosen_gain" in r for r in ok) else None,
        # a collapsed task (one answer to nearly every question) has not learnt the task, whatever its gain
        "every_task_gains_10_points": bool(ok) and all(r["gain"] >= TARGETS["min_gain"] and not r.get("collapsed")
                                                       for r in ok),
        "collapsed_tasks": [r["task"] for r in ok if r.get("collapsed")],
        "none_below_base_lenient": bool(ok) and all(r["trained_accuracy"] >= r["base_lenient"] for r in ok),
        "mean_gain_15_points": bool(gains) and sum(gains) / len(gains) >= TARGETS["mean_gain"],
        "why_not": {r["task"]: r["shortfall"]["why_not"] for r in ok if r.get("shortfall", {}).get("why_not")},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default=None, help="comma-separated task specs (default: the panel); a spec is "
                        "'task' or 'task={json settings}' (commas inside the braces are the settings')")
    parser.add_argument("--steps", type=int, default=None, help="GRPO steps per task (default: the recipe's)")
    parser.add_argument("--parallel", type=int, default=2, help="tasks at a time (one thread each)")
    parser.add_argument("--out", default=None, help="folder for the JSON (default: a temporary folder)")
    parser.add_argument("--recipe-args", default="", help='more arguments of the recipe\'s base(), e.g. '
                        '", temperature=0.7" (the JSON records them; the panel\'s verdict is for the defaults)')
    parser.add_argument("--seed", type=int, default=0, help="the GRPO stage's seed (prompt order, sampling); the "
                        "rows stay the same, so runs with other seeds give the spread of the panel's figures")
    parser.add_argument("--set", action="append", default=[], metavar="PATH=VALUE",
                        help="a set: override of the graph, e.g. stages.grpo.prompts_per_step=16 (repeatable; "
                        "the JSON records them; the panel's verdict is for the defaults)")
    parser.add_argument("--max-train-minutes", type=float, default=TRAIN_MINUTES,
                        help="each task's training time budget: the step that spends it is the last (0: none)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--workdir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if re.search(r"(^|[\s,(])(task|settings|steps)\s*=", args.recipe_args):
        parser.error(f"--recipe-args {args.recipe_args!r} sets an argument the panel sets itself (task, settings, "
                     "steps): use --tasks or --steps, so the JSON records what ran")
    args.steps = args.steps if args.steps is not None else recipe_steps()
    if args.child:
        return child(args.child, args.steps, Path(args.workdir), args.recipe_args, args.seed, overrides(args),
                     args.max_train_minutes or None)
    specs = PANEL if args.tasks is None else split_specs(args.tasks)
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="transfer-"))
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    workdir = Path(tempfile.mkdtemp(prefix=f"transfer-{stamp}-"))
    load_before = os.getloadavg()
    started = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"transfer-{stamp}-seed{args.seed}.json"  # two seeds started together write two files
    for n in range(2, 1000):
        if not path.exists():
            break
        path = out / f"transfer-{stamp}-seed{args.seed}-{n}.json"
    done: dict[int, dict] = {}
    lock = threading.Lock()

    def write() -> dict:  # after every task: a run cut short keeps the tasks it finished
        rows = [done[i] for i in sorted(done)]
        result = {
            "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "recipe": "experiments/smollm2_tasks.py" + (f" base(...{args.recipe_args})" if args.recipe_args
                                                        else " (defaults)"),
            "model": "SmolLM2-135M-Instruct, fp32, CPU", "steps": args.steps, "seed": args.seed, "overrides": list(overrides(args)),
            "max_train_minutes": args.max_train_minutes or None,
            "parallel": args.parallel, "targets": TARGETS, "verdict": verdict(rows),
            "finished": len(done) == len(specs), "wall_minutes": round((time.perf_counter() - started) / 60, 1),
            "load_average": {"before": [round(x, 2) for x in load_before],
                             "after": [round(x, 2) for x in os.getloadavg()]},
            "machine": f"{platform.machine()}, {os.cpu_count()} cores, one thread per task",
            "command": " ".join(sys.argv), "logs": str(workdir), "tasks": rows,
        }
        path.write_text(json.dumps(result, indent=1) + "\n")
        return result

    def one(i: int) -> None:
        row = spawn(specs[i], args.steps, workdir, args.recipe_args, args.seed, overrides(args),
                    args.max_train_minutes or None)
        with lock:
            done[i] = row
            write()

    with concurrent.futures.ThreadPoolExecutor(args.parallel) as pool:
        list(pool.map(one, range(len(specs))))
    result = write()
    report_pruned(workdir)
    print(json.dumps(result["verdict"]))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
