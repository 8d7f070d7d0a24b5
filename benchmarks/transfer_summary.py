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
        --variant 'chosen by validation=transfer-selected-seed4-20261129.json@chosen'

Runs with the recipe's test stage measured both the last weights and the ones the validations chose on the test
rows: FILE@last or FILE@chosen reads its rows on those (`read_as`), so two variants of the same runs show what
choosing changed.

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
        file, _, weights = file.strip().partition("@")
        path = Path(file.strip())
        path = path if path.parent != Path(".") or path.exists() else HERE / "results" / path
        if not path.exists():
            raise SystemExit(f"--variant {name}: no such file {file.strip()!r} (looked in benchmarks/results too)")
        runs.append((path, {**json.loads(path.read_text()), "read_as": weights or None}))
    return name.strip(), runs


def read_as(row: dict, weights: str | None) -> dict:
    """A row read on the `weights` its run measured on the test rows: "last" or "chosen" (best/). Runs from
    2026-11-29 20:20 on report the last weights with the chosen ones beside them (`chosen_*`); the two runs before
    (seeds 4 and 5, `transfer-selected-*`) the chosen ones with the last beside them (`final_*`); older runs only
    the last validation (their rows are read as they are). None: as the row has it."""
    if weights not in (None, "last", "chosen"):
        raise SystemExit(f"@{weights}: expected @last or @chosen")
    prefix = {"last": "final", "chosen": "chosen"}.get(weights)
    if prefix is None or f"{prefix}_accuracy" not in row:
        return row
    return {**row, "trained_accuracy": row[f"{prefix}_accuracy"], "trained_lenient": row[f"{prefix}_lenient"],
            "gain": row[f"{prefix}_gain"], "collapsed": row[f"{prefix}_collapsed"],
            "answers": row.get(f"{prefix}_answers", {}), "ci95": None}


def variant_summary(name: str, runs: list[tuple[Path, dict]], panel: list[str] = PANEL_TASKS) -> dict:
    """Per seed the rows of its files (later files replace a task's earlier row), then per task across seeds.
    Tasks outside `panel` (a held-out task run beside it) are reported under `other_tasks`, outside the means.
    A file named FILE@last or FILE@chosen has its rows read on those weights (`read_as`)."""
    by_seed: dict[int, dict[str, dict]] = {}
    described = set()
    for path, run in runs:
        seed = run.get("seed") or 0
        described.add((run.get("recipe"), run.get("steps"), tuple(run.get("overrides") or ())))
        for row in run.get("tasks", []):
            if "error" not in row:
                row = read_as(row, run.get("read_as"))
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
                   help="a variant's run files (repeatable); FILE@last or FILE@chosen: read on those weights")
    p.add_argument("--out", default=None, help="the summary JSON (default: print only)")
    args = p.parse_args()
    variants = [variant_summary(*load(spec)) for spec in args.variant]
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
