"""`rlhf rollouts show|view STAGE_DIR`: an RL stage's recorded rollouts, printed or browsed in the terminal."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

__all__ = ["rollouts_main"]


def rollouts_main(argv: Sequence[str]) -> int:
    """`show` prints one summary line per step, or with `--step` that step's best/worst response per group;
    `view` opens the browser (`rlhf.cli.rollouts_view`, imported only then)."""
    p = argparse.ArgumentParser(prog="rlhf rollouts", description="Recorded rollouts of an RL stage: `show` prints "
                                "a line per step (with --step: best/worst per group), `view` browses them in the terminal.")
    p.add_argument("action", choices=["show", "view"])
    p.add_argument("stage_dir", help="a stage folder: <output_dir>/<experiment>/<run>/<stage>")
    p.add_argument("--step", type=int, default=None,
                   help="show: this step's best and worst response per group (without: one summary line per step)")
    a = p.parse_args(argv)
    from rlhf.trainers.records import format_records, format_step_summary, read_records

    try:
        if a.action == "view":
            from rlhf.cli.rollouts_view import view

            view(a.stage_dir)
        elif a.step is None:
            print(format_step_summary(read_records(a.stage_dir)))
            print(f"\nrlhf rollouts show {a.stage_dir} --step N: the best and worst response of each group at step N")
        else:
            print(format_records(read_records(a.stage_dir, a.step)))
    except FileNotFoundError as err:
        sys.exit(f"error: {err}")
    return 0
