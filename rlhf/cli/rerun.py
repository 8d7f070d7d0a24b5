"""Running a stored run's graph again (`rlhf rerun`), and reading that graph back (`rlhf diff RUN`).

- `find_run(repo, run)`: the Aim run with a hash (or a unique prefix of one) that stored a graph.
- `load_run_graph(repo, run)`: the stage graph an Aim run stored (`graph_json`), and the run.
- `rerun_graph(repo, run)`: that graph as a one-stage Experiment; `rerun(run)` runs it, and the
  new run records `rerun_of` = the old hash.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

import fiddle as fdl

from rlhf.cli.experiment import format_results
from rlhf.config.overrides import OverrideError, apply_set
from rlhf.config.provenance import labelled
from rlhf.graph.io import GraphSourceError, from_json, make_experiments_importable
from rlhf.runtime.experiment import Experiment, run_experiment
from rlhf.runtime.local import LocalRuntime
from rlhf.runtime.preflight import PreflightError
from rlhf.runtime.ray_runtime import RayRuntime
from rlhf.tracking.aim_tracker import AimTracker
from rlhf.tracking.query import find_runs

__all__ = ["find_run", "load_run_graph", "rerun", "rerun_graph", "rerun_main"]


def find_run(repo: str, run: str) -> dict[str, Any]:
    """The run of `repo` whose hash is `run` (or starts with it), as `query.find_runs` gives it."""
    if not os.path.isdir(repo):
        raise FileNotFoundError(f"no Aim repo at {repo!r} (pass --repo DIR, the folder holding .aim)")
    matches = [r for r in find_runs(repo) if r["hash"].startswith(run)]
    if not matches:
        raise LookupError(f"no run {run!r} in the Aim repo {repo!r} (list them with `aim runs ls --repo {repo}`)")
    if len(matches) > 1:
        raise LookupError(f"{run!r} is the start of {len(matches)} run hashes: {', '.join(r['hash'] for r in matches)}")
    (found,) = matches
    if not isinstance(found["params"].get("graph_json"), str):
        raise LookupError(f"run {found['hash']} stored no graph_json (was it started by rlhf, and closed?)")
    return found


def load_run_graph(repo: str, run: str) -> tuple[fdl.Buildable, dict[str, Any]]:
    """(the stage graph the run stored, the run) for a run hash or hash prefix."""
    found = find_run(repo, run)
    make_experiments_importable()
    return from_json(found["params"]["graph_json"]), found


def rerun_graph(
    repo: str, run: str, *, local: bool = False, output_dir: str = "outputs", commands: Sequence[str] = ()
) -> tuple[fdl.Config, dict[str, Any]]:
    """The one-stage Experiment that runs a stored run's stage graph again, and the run.

    The stored graph is the stage graph after `StageOutput`s were resolved (an RL stage stores
    the concrete SFT checkpoint path), so it runs on its own. The runtime is not stored with a
    run: `local=True` runs in-process (LocalRuntime), else on Ray. `commands` are `set:`
    overrides applied on top (e.g. `set:stages.grpo.total_steps=3`).
    """
    stage_graph, found = load_run_graph(repo, run)
    stage = found["params"].get("stage") or "stage"
    name = found["experiment"] or "rerun"
    with labelled(f"rerun of {found['hash']}", with_caller=False):
        root = fdl.Config(
            Experiment,
            name=name,
            stages={stage: stage_graph},
            runtime=fdl.Config(LocalRuntime if local else RayRuntime),
            tracker=fdl.Config(AimTracker, repo=repo, experiment=name),
            output_dir=output_dir,
        )
    for command in commands:
        if not command.startswith("set:"):
            raise OverrideError(f"rerun takes set:PATH=VALUE overrides only, got {command!r}")
        apply_set(root, command.removeprefix("set:"))
    return root, found


def rerun(
    run: str, repo: str = ".aim", *, local: bool = False, output_dir: str = "outputs", commands: Sequence[str] = ()
) -> dict[str, dict[str, Any]]:
    """Run a stored run's stage graph again; the new Aim run records `rerun_of` = the old hash."""
    root, found = rerun_graph(repo, run, local=local, output_dir=output_dir, commands=commands)
    return run_experiment(
        root, overrides=[f"rerun:{found['hash']}", *commands], run_params={"rerun_of": found["hash"]}
    )


def rerun_main(argv: Sequence[str]) -> int:
    """`rlhf rerun RUN_HASH [--repo .aim] [--local] [--config set:PATH=VALUE ...]`."""
    p = argparse.ArgumentParser(
        prog="rlhf rerun",
        description="Run the stage graph an Aim run stored (graph_json) again, as a one-stage experiment. "
        "StageOutput references were stored resolved (e.g. the SFT checkpoint path), so it runs standalone.",
    )
    p.add_argument("run", help="Aim run hash (or a unique prefix)")
    p.add_argument("--repo", default=".aim", help="Aim repo to read the run from and record the new run in")
    p.add_argument("--local", action="store_true", help="run in-process (LocalRuntime) instead of on Ray")
    p.add_argument("--output_dir", default="outputs")
    p.add_argument("--config", action="append", default=[], metavar="set:PATH=VALUE",
                   help="change the stored graph (paths start at stages.<stage>)")
    args = p.parse_args(argv)
    try:
        results = rerun(args.run, args.repo, local=args.local, output_dir=args.output_dir, commands=args.config)
    except (LookupError, FileNotFoundError, GraphSourceError, OverrideError, PreflightError) as err:
        sys.exit(f"error: {err}")
    print(format_results(results))
    return 0
