"""Reading runs back from an Aim repo: for tests, CLIs and sweep reports.

Queries run with `report_mode=0` (no progress bar); metric values come from `.dataframe()`
(the sparse numpy view returns hashed steps).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import aim
from aim.sdk.types import QueryReportMode

__all__ = ["find_runs", "metric_values", "text_values", "artifact_path"]


def find_runs(repo: str | aim.Repo, experiment: str | None = None) -> list[dict[str, Any]]:
    """Every run (of `experiment`, if given), oldest first.

    Each is `{"hash", "experiment", "name", "tags", "created", "stage", "status", "parent_run",
    "graph_hash", "params"}`; `params` holds all the run's params (`graph_json` included). A run
    that is not indexed yet (still open, or its process died before closing it) has empty
    `params`, so its stage, status, ... are None: Aim cannot read its params until it is indexed.
    """
    query = "" if experiment is None else f"run.experiment == {experiment!r}"
    runs = []
    for item in _repo(repo).query_runs(query, report_mode=QueryReportMode.DISABLED).iter_runs():
        run = item.run
        params = run.get(..., default=None) or {}
        runs.append(
            {
                "hash": run.hash,
                "experiment": run.experiment,
                "name": run.name,
                "tags": list(run.tags),
                "created": run.creation_time,
                "stage": params.get("stage"),
                "status": params.get("status"),
                "parent_run": params.get("parent_run"),
                "graph_hash": params.get("graph_hash"),
                "params": params,
            }
        )
    return sorted(runs, key=lambda r: r["created"])


def metric_values(repo: str | aim.Repo, run_hash: str, name: str) -> list[tuple[int, float]]:
    """`[(step, value), ...]` of metric `name` in run `run_hash`, by step; `[]` if never tracked."""
    query = f"run.hash == {run_hash!r} and metric.name == {name!r}"
    for metric in _repo(repo).query_metrics(query, report_mode=QueryReportMode.DISABLED).iter():
        frame = metric.dataframe()
        return [(int(s), float(v)) for s, v in zip(frame["step"], frame["value"])]
    return []


def text_values(repo: str | aim.Repo, run_hash: str, name: str) -> list[tuple[int, str]]:
    """`[(step, text), ...]` of the text sequence `name` in run `run_hash`; `[]` if never logged."""
    query = f"run.hash == {run_hash!r} and texts.name == {name!r}"
    for texts in _repo(repo).query_texts(query, report_mode=QueryReportMode.DISABLED).iter():
        steps, (values, *_epochs_and_times) = texts.data.items_list()
        return [(int(step), value.data) for step, value in zip(steps, values)]
    return []


def artifact_path(repo: str | aim.Repo, run_hash: str, name: str) -> Path | None:
    """Local path of the artifact `name` saved with the run (`file://` artifact stores only)."""
    run = _repo(repo).get_run(run_hash)
    artifact = run.artifacts.get(name) if run is not None else None
    if artifact is None:
        return None
    uri = urlparse(artifact.uri)
    if uri.scheme != "file":
        raise ValueError(f"artifact {name!r} of run {run_hash} is not on a local file system: {artifact.uri}")
    return Path(uri.path)


def _repo(repo: str | aim.Repo) -> aim.Repo:
    return repo if isinstance(repo, aim.Repo) else aim.Repo.from_path(str(repo))


def producer_run(repo: str, path: str, param: str = "checkpoint") -> str | None:
    """The hash of the latest Aim run in `repo` whose param `param` names `path`, or None.

    A trainer's run records `checkpoint` = `<output_dir>/<experiment>/<stamp>/<stage>/final` as
    the trainer wrote it (often relative), and `rlhf generate` records `generations` = its output
    file. Paths match when they resolve to the same file from the current directory, or, for
    such a checkpoint from another directory, when their last four parts are equal (the
    timestamp makes those unique).
    """
    if not aim.Repo.exists(str(repo)):
        return None
    target = Path(path).expanduser().resolve()
    exact, by_tail = [], []
    for run in find_runs(repo):
        value = run["params"].get(param)
        if not isinstance(value, str):
            continue
        if Path(value).expanduser().resolve() == target:
            exact.append(run["hash"])
        elif len(Path(value).parts) >= 4 and Path(value).parts[-4:] == target.parts[-4:]:
            by_tail.append(run["hash"])
    found = exact or by_tail
    return found[-1] if found else None
