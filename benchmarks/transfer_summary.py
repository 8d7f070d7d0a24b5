"""The transfer panel across runs: each variant of the recipe over its seeds, per task, with why it fell short.

`benchmarks/transfer.py` writes one JSON per run (one seed of one variant). This reads several, groups them into
named variants (the default recipe, and each thing tried instead), and reports per variant the gain of every task
in every seed, its mean and range, how many seeds met the per-task target, the mean gain per seed, and for each
task and seed why it missed the targets (`transfer.shortfall`, recomputed from the rows, so older runs get it
too). A seed's rows may come from several files (a task rerun, a task added later): later files replace earlier
rows of the same task and seed.

    python benchmarks/transfer_summary.py \\
        --variant 'default=transfer-seed2-20261128.json,transfer-seed3-20261128.json' \\
        --variant 'steps16=transfer-explore-steps16-seed0-20261128.json' --out summary.json
        --last-weights 'default, last weights=transfer-selected-seed4-20261129.json'   # runs with the test stage

Runs with the test stage (`selected_step` in their rows) report the weights the validations chose; `--last-weights`
reads the same runs on their last weights, so the two variants side by side show what the choice changed.

File names without a folder are looked up in benchmarks/results.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from transfer import PANEL, TARGETS, parse_task, shortfall  # noqa: E402

PANEL_TASKS = [parse_task(spec)[0] for spec in PANEL]


def load(spec: str) -> tuple[str, list[tuple[Path, dict]]]:
    """'name=file,file,...' -> (name, [(path, the run's JSON)])."""
    name, sep, files = spec.partition("=")
    if not sep or not files.strip():
        raise SystemExit(f"--variant {spec!r}: expected NAME=FILE[,FILE...]")
    runs = []
    for file in files.split(","):
        path = Path(file.strip())
        path = path if path.parent != Path(".") or path.exists() else HERE / "results" / path
        if not path.exists():
            raise SystemExit(f"--variant {name}: no such file {file.strip()!r} (looked in benchmarks/results too)")
        runs.append((path, json.loads(path.read_text())))
    return name.strip(), runs


def last_weights(row: dict) -> dict:
    """A row of a run with the test stage read on its last weights (`final_*`) instead of the chosen ones: what
    choosing by validation changed, on the same runs."""
    if "final_accuracy" not in row:
        raise SystemExit(f"{row['task']}: the run has no last-weights figures (a run from before the test stage)")
    return {**row, "trained_accuracy": row["final_accuracy"], "trained_lenient": row["final_lenient"],
            "gain": row["final_gain"], "collapsed": row["final_collapsed"], "answers": row.get("final_answers", {}),
            "ci95": None}


def variant_summary(name: str, runs: list[tuple[Path, dict]], panel: list[str] = PANEL_TASKS,
                    weights: str = "chosen") -> dict:
    """Per seed the rows of its files (later files replace a task's earlier row), then per task across seeds.
    Tasks outside `panel` (a held-out task run beside it) are reported under `other_tasks`, outside the means.
    `weights` "last": rows read on the last weights (`last_weights`), for runs with the test stage."""
    by_seed: dict[int, dict[str, dict]] = {}
    described = set()
    for path, run in runs:
        seed = run.get("seed") or 0
        described.add((run.get("recipe"), run.get("steps"), tuple(run.get("overrides") or ())))
        for row in run.get("tasks", []):
            if "error" not in row:
                row = last_weights(row) if weights == "last" else row
                by_seed.setdefault(seed, {})[row["task"]] = {**row, "file": path.name}
    seeds = sorted(by_seed)
    others = {seed: {t: r for t, r in rows.items() if t not in panel} for seed, rows in by_seed.items()}
    by_seed = {seed: {t: r for t, r in rows.items() if t in panel} for seed, rows in by_seed.items()}
    tasks = [task for task in panel if any(task in by_seed[seed] for seed in seeds)]
    per_task = {}
    for task in tasks:
        rows = {seed: by_seed[seed][task] for seed in seeds if task in by_seed[seed]}
        gains = [r["gain"] for r in rows.values()]
        checks = {seed: shortfall(r) for seed, r in rows.items()}
        per_task[task] = {
            "base_accuracy": next(iter(rows.values()))["base_accuracy"],
            "trained": {seed: r["trained_accuracy"] for seed, r in rows.items()},
            "gains": {seed: r["gain"] for seed, r in rows.items()},
            "mean_gain": round(statistics.mean(gains), 4), "gain_range": [min(gains), max(gains)],
            "met_in_seeds": sum(c["met"] for c in checks.values()), "seeds": len(rows),
            "why_not": {seed: c["why_not"] for seed, c in checks.items() if c["why_not"]},
            "caveats": {seed: c["caveats"] for seed, c in checks.items() if c["caveats"]},
        }
    full = [seed for seed in seeds if set(by_seed[seed]) == set(panel)]  # seeds that ran the whole panel
    mean_by_seed = {seed: round(statistics.mean(r["gain"] for r in by_seed[seed].values()), 4) for seed in full}
    return {
        "name": name, "files": [path.name for path, _ in runs],
        "runs_as": [{"recipe": r, "steps": s, "overrides": list(o)} for r, s, o in sorted(described, key=str)],
        "seeds": seeds, "tasks": per_task,
        "mean_gain_per_seed": mean_by_seed,
        "mean_gain": round(statistics.mean(mean_by_seed.values()), 4) if mean_by_seed else None,
        "tasks_meeting_target_per_seed": {seed: sum(shortfall(r)["met"] for r in by_seed[seed].values())
                                          for seed in full},
        "mean_gain_target_met_in_seeds": sum(g >= TARGETS["mean_gain"] for g in mean_by_seed.values()),
        "other_tasks": {seed: {t: {"gain": r["gain"], "base_accuracy": r["base_accuracy"],
                                   "trained_accuracy": r["trained_accuracy"], **shortfall(r)} for t, r in rows.items()}
                        for seed, rows in others.items() if rows},
    }


def markdown(variant: dict) -> str:
    """One table: a row per task, a column per seed (gain in points), mean, and seeds meeting the target."""
    seeds = variant["seeds"]
    lines = [f"### {variant['name']}", "", "| task | base | " + " | ".join(f"seed {s}" for s in seeds)
             + " | mean gain | met |", "|---" * (len(seeds) + 4) + "|"]
    for task, t in variant["tasks"].items():
        cells = [f"{100 * t['gains'][s]:+.1f}" if s in t["gains"] else "" for s in seeds]
        lines.append(f"| {task} | {100 * t['base_accuracy']:.1f}% | " + " | ".join(cells)
                     + f" | {100 * t['mean_gain']:+.1f} | {t['met_in_seeds']}/{t['seeds']} |")
    means = [f"{100 * variant['mean_gain_per_seed'][s]:+.1f}" if s in variant["mean_gain_per_seed"] else ""
             for s in seeds]
    overall = "" if variant["mean_gain"] is None else f"{100 * variant['mean_gain']:+.1f}"
    lines.append("| **mean gain** | | " + " | ".join(means) + f" | {overall} | |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variant", action="append", required=True, metavar="NAME=FILE[,FILE...]",
                   help="a variant's run files (repeatable)")
    p.add_argument("--last-weights", action="append", default=[], metavar="NAME=FILE[,FILE...]",
                   help="runs with the test stage read on their last weights instead of the chosen ones (repeatable)")
    p.add_argument("--out", default=None, help="the summary JSON (default: print only)")
    args = p.parse_args()
    variants = [variant_summary(*load(spec)) for spec in args.variant]
    variants += [variant_summary(*load(spec), weights="last") for spec in args.last_weights]
    for v in variants:
        print(markdown(v), "\n")
    if args.out:
        Path(args.out).write_text(json.dumps({
            "date": datetime.date.today().isoformat(), "targets": TARGETS, "command": " ".join(sys.argv),
            "what": "benchmarks/transfer.py runs grouped into variants of experiments/smollm2_tasks.py; per task and "
                    "seed the gain (held-out strict accuracy, 200 rows, greedy) and why it missed the targets "
                    "(transfer.shortfall, from the runs' own measurements)",
            "variants": variants}, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
