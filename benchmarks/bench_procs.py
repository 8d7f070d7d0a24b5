"""Process-tree memory sampling and the machine description for benchmark results.

A framework's memory is the summed RSS of its whole process tree: the driver, and for Ray
the GCS, raylet and other daemons `ray.init` starts as the driver's children, and the worker
actors the raylet forks. Summed RSS counts pages shared between processes (the torch
libraries) once per process, so it over-states the physical memory of multi-process runs;
PSS (shared pages split between their users) is sampled too, less often because reading
`smaps` is slow.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import threading
import time
from importlib import metadata
from pathlib import Path

import psutil


def _role(proc: psutil.Process) -> str:
    """A short label for a process of the tree (driver, ray daemon, ray worker)."""
    try:
        name = proc.name()
        cmd = " ".join(proc.cmdline()[:3])
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return "gone"
    if "gcs_server" in name or "gcs_server" in cmd:
        return "ray:gcs"
    if "raylet" in name or "raylet" in cmd:
        return "ray:raylet"
    if name.startswith("ray::") or "default_worker.py" in cmd:
        return "ray:worker"
    if "ray" in cmd and ("dashboard" in cmd or "log_monitor" in cmd or "runtime_env" in cmd or "monitor" in cmd):
        return "ray:daemon"
    return "driver" if "_vs_trl" in cmd else f"other:{name}"


def tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


class TreeMemorySampler:
    """Polls the summed RSS (every `interval` s) and PSS (every `pss_every` polls) of a process tree."""

    def __init__(self, pid: int, interval: float = 0.2, pss_every: int = 10):
        self.pid = pid
        self.interval = interval
        self.pss_every = pss_every
        self.peak_rss = 0
        self.peak_pss = 0
        self.peak_by_role: dict[str, int] = {}
        self.max_procs = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> TreeMemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        polls = 0
        while not self._stop.is_set():
            procs = tree(self.pid)
            total, by_role = 0, {}
            for p in procs:
                try:
                    rss = p.memory_info().rss
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
                total += rss
                role = _role(p)
                by_role[role] = by_role.get(role, 0) + rss
            if total > self.peak_rss:
                self.peak_rss, self.peak_by_role = total, by_role
            self.max_procs = max(self.max_procs, len(procs))
            if polls % self.pss_every == 0:
                pss = 0
                for p in procs:
                    try:
                        pss += p.memory_full_info().pss
                    except (psutil.NoSuchProcess, psutil.AccessDenied, AttributeError):
                        continue
                self.peak_pss = max(self.peak_pss, pss)
            polls += 1
            self._stop.wait(self.interval)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _source_revision(root: Path) -> str | None:
    """The checked-out commit, read from .git without running git (None when unknown)."""
    head = root / ".git" / "HEAD"
    try:
        ref = head.read_text().strip()
        if ref.startswith("ref: "):
            return (root / ".git" / ref[5:]).read_text().strip()
        return ref
    except OSError:
        return None


def machine_info(root: Path) -> dict:
    load1, load5, load15 = os.getloadavg()
    mem = psutil.virtual_memory()
    return {
        "cpu_model": _cpu_model(),
        "logical_cpus": psutil.cpu_count(logical=True),
        "physical_cores": psutil.cpu_count(logical=False),
        "ram_gib": round(mem.total / 2**30, 1),
        "ram_available_gib_at_start": round(mem.available / 2**30, 1),
        "load_average_at_start": [round(load1, 2), round(load5, 2), round(load15, 2)],
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "versions": {d: _version(d) for d in ("torch", "transformers", "trl", "accelerate", "ray", "rlhf", "psutil")},
        "source_revision": _source_revision(root),
        "uname": " ".join(platform.uname()),
    }


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def run_child(cmd: list[str], cwd: Path, timeout: float, env: dict | None = None) -> tuple[int, str, dict]:
    """Run a child process, sampling its tree's memory; returns (exit code, output tail, memory figures)."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    with TreeMemorySampler(proc.pid) as sampler:
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for p in reversed(tree(proc.pid)):
                try:
                    p.kill()
                except psutil.NoSuchProcess:
                    pass
            out, _ = proc.communicate()
            out += f"\n[killed after {timeout:.0f} s]"
    memory = {
        "peak_rss_mib": round(sampler.peak_rss / 2**20, 1),
        "peak_pss_mib": round(sampler.peak_pss / 2**20, 1),
        "peak_rss_by_role_mib": {k: round(v / 2**20, 1) for k, v in sorted(sampler.peak_by_role.items())},
        "max_processes": sampler.max_procs,
        "process_wall_s": round(time.perf_counter() - start, 2),
    }
    return proc.returncode, out[-6000:], memory
