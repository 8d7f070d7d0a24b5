"""`rlhf ui`: Aim's UI on loopback (`rlhf.tracking.ui.AimUI`), with links comparing the latest runs and the latest sweep."""

from __future__ import annotations

import argparse
import signal
import sys
import time
from collections.abc import Sequence

from rlhf.cli.signals import interrupt
from rlhf.tracking.ui import AimUI, latest_runs_url, sweep_url

__all__ = ["ui_main"]


def ui_main(argv: Sequence[str]) -> int:
    """`rlhf ui [--repo .aim] [--port PORT] [--experiment NAME] [--runs N] [--sweep ID] [--metric NAME ...]`."""
    p = argparse.ArgumentParser(prog="rlhf ui", description="Start Aim's UI on loopback and link to comparisons of "
                                "the latest runs and of the latest sweep.")
    p.add_argument("--repo", default=".aim", help="Aim repo (default .aim)")
    p.add_argument("--port", type=int, default=None, help="port (default: a free one)")
    p.add_argument("--experiment", default=None, help="whose runs to compare (default: the newest run's experiment)")
    p.add_argument("--runs", type=int, default=8, help="how many of its newest runs to compare (default 8)")
    p.add_argument("--sweep", default=None, help="sweep id to link to (default: the latest)")
    p.add_argument("--metric", action="append", default=None, help="metric to chart (default: the headline ones)")
    args = p.parse_args(argv)
    ui = AimUI(args.repo, port=args.port)
    signal.signal(signal.SIGTERM, interrupt)  # a plain `kill` also stops aim up's process group
    try:
        ui.start()
        print(f"Aim UI: {ui.url}/  (aim up process group {ui.proc.pid}; Ctrl-C stops it)", flush=True)
        for label, make in (("runs", lambda: latest_runs_url(ui.url, args.repo, args.experiment, args.runs, args.metric)),
                            ("sweep", lambda: sweep_url(ui.url, args.repo, args.sweep, args.metric))):
            try:
                print(f"{label}: {make()}", flush=True)
            except LookupError as err:
                print(f"({err})", flush=True)
        while ui.proc is not None and ui.proc.poll() is None:
            time.sleep(0.5)
        return 1  # aim up ended on its own
    except KeyboardInterrupt:
        return 0
    except (FileNotFoundError, RuntimeError, TimeoutError) as err:
        sys.exit(f"error: {err}")
    finally:
        ui.stop()
