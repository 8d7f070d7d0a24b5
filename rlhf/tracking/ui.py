"""Aim's UI for comparing runs: start `aim up` safely, and link straight to a sweep's curves.

`AimUI(repo).start()` runs `aim up` on loopback in its own process group (it leaves a uvicorn
child behind when only the parent is killed, so `stop()` ends the whole group) and waits
until it answers. `sweep_url(ui.url, repo)` is the Metrics explorer showing the runs of the
latest sweep (or of `sweep_id`), one chart per metric, coloured by the swept fields
(`run.params.sweep.overrides.<path>`). The explorer's state lives in the URL: `select` and
`grouping` are JSON, URI-escaped, then base64url-encoded without padding behind `O-`
(Aim's `aim64encode`). `latest_runs_url` is the same view for the newest runs of the latest
experiment (no sweep needed), coloured by run name (`<experiment>/<run>/<stage>`).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["HEADLINE_METRICS", "AimUI", "aim64encode", "latest_runs_url", "latest_sweep", "metrics_url", "sweep_url"]

# Metrics a sweep view shows by default, where the runs have them (else every metric).
HEADLINE_METRICS = ("val-core/", "critic/score/mean", "sft/loss")


class AimUI:
    """`aim up --repo REPO` on `host:port` (a free port by default) in its own process group."""

    def __init__(self, repo: str = ".aim", port: int | None = None, host: str = "127.0.0.1", log: str | None = None):
        self.repo, self.host, self.port = str(repo), host, port or free_port(host)
        self.log_path = log
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout_s: float = 120.0) -> AimUI:
        """Start `aim up` and wait until its API answers; raises RuntimeError with its output if it dies."""
        if not Path(self.repo).exists():
            raise FileNotFoundError(f"no Aim repo at {self.repo!r}: run an experiment first, or pass --repo DIR")
        log = open(self.log_path, "w") if self.log_path else subprocess.DEVNULL
        self.proc = subprocess.Popen(
            [aim_executable(), "up", "--repo", self.repo, "--host", self.host, "--port", str(self.port), "--workers", "1",
             "--yes"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,  # own process group: stop() ends it all
        )
        if log is not subprocess.DEVNULL:
            log.close()  # the child holds its own copy
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                out = Path(self.log_path).read_text(errors="replace")[-2000:] if self.log_path else ""
                raise RuntimeError(f"aim up exited with {self.proc.returncode}{':' if out else ''}\n{out}")
            try:
                with urllib.request.urlopen(f"{self.url}/api/projects/", timeout=5) as reply:
                    if reply.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            time.sleep(0.5)
        self.stop()
        raise TimeoutError(f"aim up did not answer on {self.url} within {timeout_s:.0f} s")

    def stop(self) -> None:
        """SIGTERM the whole process group (aim up and its uvicorn child), SIGKILL what remains."""
        if self.proc is None:
            return
        pgid = self.proc.pid  # start_new_session: the group id is the leader's pid
        for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline and _group_alive(pgid):
                try:
                    self.proc.wait(timeout=0.1)
                except subprocess.TimeoutExpired:
                    pass
            if not _group_alive(pgid):
                break
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        self.proc = None

    def __enter__(self) -> AimUI:
        return self.start() if self.proc is None else self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # Zombies of our own children still count for killpg; reap the ones we can.
    try:
        while os.waitpid(-pgid, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def aim_executable() -> str:
    here = Path(sys.executable).with_name("aim")
    found = str(here) if here.exists() else shutil.which("aim")
    if not found:
        raise FileNotFoundError("the `aim` command is not installed (pip install aim)")
    return found


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------- URLs
def aim64encode(state: Mapping[str, Any]) -> str:
    """Aim's URL encoding of explorer state: `O-` + base64url(encodeURI(JSON)) without padding."""
    text = json.dumps(state, separators=(",", ":"), ensure_ascii=False)
    uri = urllib.parse.quote(text, safe=";,/?:@&=+$-_.!~*'()#")  # what JavaScript's encodeURI leaves alone
    return "O-" + base64.urlsafe_b64encode(uri.encode("ascii")).decode("ascii").rstrip("=")


def metrics_url(
    base_url: str,
    *,
    query: str = "",
    metrics: Sequence[str] = (),
    color: Sequence[str] = (),
    stroke: Sequence[str] = (),
    chart: Sequence[str] = ("name",),
) -> str:
    """The Metrics explorer: runs matching `query` (Aim's query language, e.g. `run.sweep.id == "x"`),
    the metrics named (all when empty), one chart per `chart` group, coloured by `color` fields."""
    select = {
        "options": [{"value": {"option_name": name, "context": None}} for name in metrics],
        "query": query,
        "advancedMode": False,
        "advancedQuery": "",
    }
    grouping = {"color": list(color), "stroke": list(stroke), "chart": list(chart)}
    params = urllib.parse.urlencode({"grouping": aim64encode(grouping), "select": aim64encode(select)})
    return f"{base_url.rstrip('/')}/metrics?{params}"


def latest_sweep(repo: str, sweep_id: str | None = None) -> dict[str, Any] | None:
    """The newest sweep in `repo` (or `sweep_id`): `{"id", "name", "runs", "swept"}`, where `swept` are
    the `sweep.overrides` fields (dotted) whose values differ between its runs; None if there is none."""
    from rlhf.tracking.query import find_runs

    by_sweep: dict[str, list[dict]] = {}
    for run in find_runs(repo):
        info = run["params"].get("sweep")
        if isinstance(info, Mapping) and info.get("id"):
            by_sweep.setdefault(info["id"], []).append(run)
    if not by_sweep:
        return None
    if sweep_id is None:
        sweep_id = max(by_sweep, key=lambda s: max(r["created"] for r in by_sweep[s]))
    elif sweep_id not in by_sweep:
        raise LookupError(f"no sweep {sweep_id!r} in {repo!r}; sweeps there: {', '.join(sorted(by_sweep))}")
    runs = by_sweep[sweep_id]
    values: dict[str, set] = {}
    for run in runs:
        for key, value in _dotted(run["params"]["sweep"].get("overrides") or {}).items():
            values.setdefault(key, set()).add(json.dumps(value, sort_keys=True))
    swept = [k for k, v in values.items() if len(v) > 1] or list(values)
    return {"id": sweep_id, "name": runs[0]["params"]["sweep"].get("name"), "runs": runs, "swept": sorted(swept)}


def sweep_url(base_url: str, repo: str, sweep_id: str | None = None, metrics: Iterable[str] | None = None) -> str:
    """Metrics explorer URL of a sweep's runs, coloured by its swept fields (headline metrics by default)."""
    found = latest_sweep(repo, sweep_id)
    if found is None:
        raise LookupError(f"no sweep in the Aim repo {repo!r} (run one: python experiments/x.py --sweep NAME)")
    if metrics is None:
        names = _metric_names(repo, query=f'run.sweep.id == "{found["id"]}"')
        metrics = [n for n in names if n.startswith(HEADLINE_METRICS)]
    return metrics_url(
        base_url,
        query=f'run.sweep.id == "{found["id"]}"',
        metrics=list(metrics),
        color=[f"run.params.sweep.overrides.{k}" for k in found["swept"]],
    )


def latest_runs_url(base_url: str, repo: str, experiment: str | None = None, limit: int = 8,
                    metrics: Iterable[str] | None = None) -> str:
    """Metrics explorer URL comparing the `limit` newest runs of `experiment` (default: the experiment
    of the newest run), one chart per headline metric, one colour per run name (`run.props.name`: Aim's grouping field)."""
    from rlhf.tracking.query import find_runs

    runs = find_runs(repo)
    if not runs:
        raise LookupError(f"no runs in the Aim repo {repo!r} yet (run an experiment first)")
    experiment = experiment or runs[-1]["experiment"]
    chosen = [r for r in runs if r["experiment"] == experiment][-limit:]
    if not chosen:
        raise LookupError(f"no runs of experiment {experiment!r} in {repo!r}")
    hashes = [r["hash"] for r in chosen]
    query = f"run.hash in {hashes!r}"
    if metrics is None:
        names = _metric_names(repo, query=query)
        metrics = [n for n in names if n.startswith(HEADLINE_METRICS)]
    return metrics_url(base_url, query=query, metrics=list(metrics), color=["run.props.name"])


def _dotted(nested: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in nested.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(_dotted(value, path + "."))
        else:
            out[path] = value
    return out


def _metric_names(repo: str, query: str) -> list[str]:
    import aim
    from aim.sdk.types import QueryReportMode

    metrics = aim.Repo.from_path(str(repo)).query_metrics(query, report_mode=QueryReportMode.DISABLED)
    return sorted({m.name for m in metrics.iter()})
