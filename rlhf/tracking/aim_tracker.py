"""Aim runs owned by the driver: one run per stage (SFT, RL, eval), indexed the moment it closes.

Workers never open runs: they return metrics to the driver, which calls `TrackedRun.track`.
Aim 3.29 only indexes a closed run when `aim up` (or another indexer) gets to it; until then the run
is missing from `Repo.iter_runs()` and read-only param access. `TrackedRun.close` indexes it at
once, so queries and `aim up` see the finished run immediately.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
import types
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

try:  # optional where runs are not tracked (a bare GPU machine, `fiddler:no_tracking`): AimTracker says so
    import aim
    import aimrocks.errors
    from aim.sdk.index_manager import RepoIndexManager
except ImportError as _missing:
    aim = None
    _AIM_MISSING = _missing

from rlhf.io.lock import held_folder

__all__ = ["AimTracker", "TrackedRun", "Status"]

log = logging.getLogger(__name__)

Status = Literal["finished", "interrupted", "failed"]
_NO_PARAMS: Mapping[str, Any] = types.MappingProxyType({})
GRAPH_ARTIFACT = "graph.json"


class AimTracker:
    """Opens Aim runs in one local repository.

    Args:
      repo: the directory holding (or to hold) Aim's `.aim` folder; a path ending in `.aim` means
        its parent, as in Aim's own CLI. Created here if absent, before any run is opened: several
        processes creating it at once race.
      experiment: Aim's experiment name for every run of this tracker.
      artifacts_uri: where `save_artifact` copies files; default `file://<repo>/.aim/artifacts`.
      system_tracking_interval: seconds between Aim's CPU/memory samples; None disables the sampler
        thread.
      capture_terminal_logs: whether Aim copies stdout/stderr into the run (a background thread).
    """

    def __init__(
        self,
        repo: str = ".aim",
        experiment: str = "default",
        *,
        artifacts_uri: str | None = None,
        system_tracking_interval: float | None = None,
        capture_terminal_logs: bool = False,
    ) -> None:
        if aim is None:
            raise ImportError(f"AimTracker needs Aim, which is not importable here ({_AIM_MISSING}): install it "
                              "(`pip install aim`), or run without tracking (`--config fiddler:no_tracking`).")
        self.repo = open_repo(str(repo))
        self.experiment = experiment
        self.artifacts_uri = artifacts_uri or Path(self.repo.path, "artifacts").absolute().as_uri()
        self._system_tracking_interval = system_tracking_interval
        self._capture_terminal_logs = capture_terminal_logs

    def start_run(
        self,
        stage: str,
        *,
        name: str | None = None,
        params: Mapping[str, Any] = _NO_PARAMS,
        parent_run: str | None = None,
        tags: Sequence[str] = (),
    ) -> TrackedRun:
        """Opens a run for `stage` ("sft", "rl", "eval", ...) with `params` as its Aim params.

        `name` is the run's name in Aim's tables (default: the stage); the experiment runner names
        runs `<experiment>/<run name or timestamp>/<stage>` so that runs of one stage tell apart.

        Also records `stage`, `parent_run` (the run whose checkpoint this one starts from, or its
        sweep) and `status` ("running" until closed). A `graph_json` string in `params` (as
        `lineage_params` builds it) is also saved as the artifact "graph.json".
        """
        run = aim.Run(
            repo=self.repo,
            experiment=self.experiment,
            system_tracking_interval=self._system_tracking_interval,
            capture_terminal_logs=self._capture_terminal_logs,
            log_system_params=False,
        )
        run.name = name or stage
        for tag in tags:
            run.add_tag(tag)
        run.set_artifacts_uri(self.artifacts_uri)
        tracked = TrackedRun(run, self.repo)
        tracked.set_params({**params, "stage": stage, "parent_run": parent_run, "status": "running"})
        if isinstance(params.get("graph_json"), str):
            tracked.save_artifact(GRAPH_ARTIFACT, params["graph_json"])
        return tracked

    def resume_run(self, run_hash: str) -> TrackedRun:
        """Reopens an earlier run to continue it (a resumed job logs into the same run).

        Re-tracking a step that the run already holds replaces its value, so the steps a
        resumed job repeats after its last checkpoint are not duplicated. An `error` left by the
        attempt that failed moves to `earlier_errors`: a run that then finishes must not show an
        error beside `status=finished`.
        """
        run = aim.Run(
            run_hash=run_hash,
            repo=self.repo,
            experiment=self.experiment,
            system_tracking_interval=self._system_tracking_interval,
            capture_terminal_logs=self._capture_terminal_logs,
            log_system_params=False,
        )
        tracked = TrackedRun(run, self.repo)
        tracked.set_params({"status": "running", "resumed": int(run.get("resumed") or 0) + 1})
        error = run.get("error")
        if error is not None:
            tracked.set_params({"earlier_errors": [*(run.get("earlier_errors") or []), error]})
            del run["error"]
        return tracked


def open_repo(path: str) -> aim.Repo:
    """The Aim repository at `path`, created first if absent, while holding a lock on the folder that holds it.

    Aim creates a repository in steps (the `.aim` folder, then its SQLite tables): a second
    process that sees the folder before the tables exist fails with `no such table: run` (two
    first runs of a sweep, or two jobs started at once, into a new repository). The lock (`flock`
    on the folder itself: no lock file is left behind) makes "exists? else create" one step for
    every process that opens the repository through here.
    """
    folder = Path(path).expanduser()
    root = folder.parent if folder.name == ".aim" else folder
    root.mkdir(parents=True, exist_ok=True)
    with held_folder(root):
        return aim.Repo.from_path(str(folder), init=not aim.Repo.exists(str(folder)))


class TrackedRun:
    """One open Aim run. A context manager: an exception closes it as "failed" (KeyboardInterrupt
    as "interrupted", with the error recorded as param `error`) and propagates."""

    def __init__(self, run: aim.Run, repo: aim.Repo) -> None:
        self._run = run
        self._repo = repo
        self.hash: str = run.hash
        self.closed = False

    def track(self, metrics: Mapping[str, float], step: int) -> None:
        """Appends each metric at `step`. Names are kept as given (`actor/pg_loss`,
        `val-core/arithmetic/acc/mean@1`): Aim accepts slashes and `@`."""
        for name, value in metrics.items():
            self._run.track(float(value), name=name, step=step)

    def set_params(self, params: Mapping[str, Any]) -> None:
        """Merges `params` into the run's params: nested dicts merge key by key, other values
        replace what was there."""
        for key, value in params.items():
            current = self._run.get(key) if isinstance(value, Mapping) else None
            self._run[key] = _merge(current, value) if isinstance(current, dict) else _plain(value)

    def log_text(self, name: str, text: str, step: int | None = None) -> None:
        """Appends `text` to the text sequence `name` (samples, generations) at `step`."""
        self._run.track(aim.Text(text), name=name, step=step)

    def save_artifact(self, name: str, text_or_path: str | os.PathLike) -> None:
        """Stores a file with the run under `name`: a `str` is the content, a path
        (`pathlib.Path`) a file to copy. Read it back with `query.artifact_path`."""
        if isinstance(text_or_path, os.PathLike):
            self._run.log_artifact(os.fspath(text_or_path), name=name, block=True)
            return
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp, "artifact")
            path.write_text(text_or_path, encoding="utf-8")
            self._run.log_artifact(str(path), name=name, block=True)

    def close(self, status: Status = "finished") -> None:
        """Records `status`, closes the run and indexes it. Closing twice does nothing."""
        if self.closed:
            return
        self._run["status"] = status
        self._run.close()
        self.closed = True
        index_run(self._repo, self.hash)

    def __enter__(self) -> TrackedRun:
        return self

    def __exit__(self, exc_type, exc, tb) -> Literal[False]:
        if exc_type is None:
            self.close("finished")
        else:
            if not self.closed:
                self._run["error"] = f"{exc_type.__name__}: {exc}"
            self.close("interrupted" if issubclass(exc_type, KeyboardInterrupt) else "failed")
        return False


def index_run(repo: aim.Repo, run_hash: str, *, wait_s: float = 10.0) -> bool:
    """Writes a closed run into the repo's index, as `aim up`'s indexer would; True if done.

    This is `aim.sdk.index_manager.RepoIndexManager.index`, the call Aim's own CLI commands
    (`aim runs upgrade`, `aim storage ...`) make, without building a `RepoIndexManager`: that one
    schedules a filesystem watcher (an inotify thread) and stays in a process-wide pool.
    The index is one RocksDB that a single process can write at a time (another run closing, an
    `aim up` indexing): a busy index is retried for `wait_s` seconds, then this logs a warning
    and leaves the run to `aim up`'s background indexer.
    """
    deadline = time.monotonic() + wait_s
    delay = 0.05
    while True:
        try:
            RepoIndexManager.index(_IndexerShim(repo), run_hash)
            return True
        except aimrocks.errors.RocksIOError as exc:  # the index's lock is held elsewhere
            if time.monotonic() + delay > deadline:
                log.warning("Aim run %s is closed but not indexed (%s); `aim up` will index it.", run_hash, exc)
                return False
            time.sleep(delay)
            delay = min(2 * delay, 1.0)


class _IndexerShim:
    """The attributes `RepoIndexManager.index` reads from its manager."""

    def __init__(self, repo: aim.Repo) -> None:
        self.repo = repo
        self.chunks_dir = Path(repo.path, "meta", "chunks")
        self._corrupted_runs: set[str] = set()

    def _get_run_checksum(self, run_hash: str) -> str:
        return RepoIndexManager._get_run_checksum(self, run_hash)

    def _stop_monitoring_chunk(self, run_hash: str) -> None:
        pass  # nothing is watched here


def _merge(base: dict, update: Mapping[str, Any]) -> dict:
    merged = dict(base)
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = _plain(value)
    return merged


def _plain(value: Any) -> Any:
    """Mappings as dicts and tuples as lists: the containers Aim stores."""
    if isinstance(value, Mapping):
        return {key: _plain(v) for key, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
