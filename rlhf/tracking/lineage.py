"""Where a run came from: the params stored on every Aim run (graph, overrides, code, data, plan)."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from typing import Any

from rlhf.graph import io as graph_io

__all__ = ["git_info", "lineage_params"]


def git_info(path: str = ".") -> dict[str, Any]:
    """`{"commit": sha, "dirty": bool}` of the git checkout holding `path`.

    `dirty` counts changes to tracked files only: untracked outputs (checkpoints, `.aim`) would
    otherwise mark every run dirty. Outside a checkout, or without `git`, both are None.
    """

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", "-C", str(path), *args], capture_output=True, text=True, timeout=30, check=False
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout if done.returncode == 0 else None

    commit = git("rev-parse", "--verify", "--quiet", "HEAD^{commit}")
    if commit is None:
        return {"commit": None, "dirty": None}
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit.strip(), "dirty": None if status is None else bool(status.strip())}


def lineage_params(
    *,
    graph: Any,
    overrides: Sequence[str],
    fiddlers: Sequence[str],
    parent_run: str | None,
    data_fingerprints: Mapping[str, str],
    plan_text: str | None,
    git_path: str = ".",
) -> dict[str, Any]:
    """The params every run records, for `AimTracker.start_run(params=...)`.

    - `graph`: the fiddle graph flattened (`graph_io.flatten`, defaults materialized) and nested,
      so Aim's UI groups runs by `run.params.graph.<path>`.
    - `graph_hash`: `graph_io.graph_hash(graph)`; equal hashes mean the same experiment.
    - `graph_json`: fiddle JSON of the graph (`graph_io.from_json` rebuilds it); the tracker also
      saves it as the artifact "graph.json".
    - `overrides`, `fiddlers`: what the command line applied, in order.
    - `git`: `git_info(git_path)`.
    - `data`: dataset name -> fingerprint.
    - `parent_run`: the run whose checkpoint this one starts from, or its sweep.
    - `plan`: the printed execution plan.
    """
    return {
        "graph": graph_io.nest(graph_io.flatten(graph)),
        "graph_hash": graph_io.graph_hash(graph),
        "graph_json": graph_io.to_json(graph),
        "overrides": list(overrides),
        "fiddlers": list(fiddlers),
        "git": git_info(git_path),
        "data": dict(data_fingerprints),
        "parent_run": parent_run,
        "plan": plan_text,
    }
