"""Resource accounting: the CPUs and GPUs a stage holds at once, against what the machine or cluster has.

`stage_resources` is the one sum: under Ray, every group that owns a resource pool holds its
workers' CPUs and GPUs (colocated groups share their owner's bundles); in-process
(LocalRuntime), the largest group's, since every group runs in the driver's process. The
preflight compares it with the machine; a sweep uses it to decide how many members run at once.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Sequence
from typing import Any

import torch

from rlhf.runtime.plan import Plan, compile_graph
from rlhf.runtime.preflight.graph import args, cli_path, runtime_kind, stage_prefix

__all__ = ["Resources", "experiment_resources", "gpu_count", "resource_problems", "stage_resources"]


@dataclasses.dataclass(frozen=True)
class Resources:
    cpus: float
    gpus: float


def gpu_count() -> int:
    """CUDA devices this process sees."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def stage_resources(plan: Plan, kind: str) -> Resources:
    """What a stage's worker groups hold at once: summed over the pools' owners under Ray (colocated
    groups use their owner's bundles), the largest group's in-process (`kind` "local")."""
    groups = list(plan.groups.values())
    if kind == "local":
        return Resources(max([0.0, *(g.cpus_per_worker for g in groups)]),
                         max([0.0, *(g.gpus_per_worker for g in groups)]))
    owners = [g for g in groups if not g.colocate_with]
    return Resources(sum(g.cpus_per_worker * g.num_workers for g in owners),
                     sum(g.gpus_per_worker * g.num_workers for g in owners))


def experiment_resources(graph: Any, stages: Sequence[str] | None = None) -> Resources:
    """What an experiment holds at once: its most demanding stage (at least one CPU: the driver)."""
    kind, _ = runtime_kind(graph)
    cpus, gpus = 1.0, 0.0
    for name, stage in dict(args(graph).get("stages") or {}).items():
        if stages is None or name in stages:
            need = stage_resources(compile_graph(stage), kind)
            cpus, gpus = max(cpus, need.cpus), max(gpus, need.gpus)
    return Resources(cpus, gpus)


def resource_problems(
    graph: Any, name: str, plan: Plan, cpus: int | None, gpus: int | None,
) -> tuple[list[str], list[str]]:
    """(errors, warnings): resources stage `name` asks for that this machine or local Ray cluster cannot give.
    `cpus`/`gpus`: what the machine has (default: `os.cpu_count()`, CUDA devices)."""
    errors: list[str] = []
    warnings: list[str] = []
    kind, ray_args = runtime_kind(graph)
    groups = ", ".join(f"{g.name}: {g.num_workers} x ({g.cpus_per_worker:g} CPU, {g.gpus_per_worker:g} GPU)"
                       for g in plan.groups.values())
    machine_gpus = gpu_count() if gpus is None else gpus
    machine_cpus = (os.cpu_count() or 1) if cpus is None else cpus
    on_cpu_fix = (f"On a CPU machine set gpus_per_worker=0: --config 'fiddler:gin(path=\"cpu.gin\")' "
                  f"(or set:{cli_path(stage_prefix(name))}.<group>.gpus_per_worker=0).")
    if kind == "local":
        if stage_resources(plan, kind).gpus > 0 and machine_gpus == 0:
            errors.append(f"stage {name!r} asks for GPUs ({groups}) but this machine has none. {on_cpu_fix}")
        return errors, warnings
    if kind != "ray" or ray_args.get("address") is not None:
        return errors, warnings  # an existing cluster's resources are known only to the cluster
    need = stage_resources(plan, kind)
    have_gpus = ray_args.get("num_gpus") if ray_args.get("num_gpus") is not None else machine_gpus
    if need.gpus > have_gpus:
        where = "this machine has none" if have_gpus == 0 else f"the local Ray cluster has {have_gpus:g}"
        errors.append(
            f"stage {name!r} needs {need.gpus:g} GPUs ({groups}) but {where}. "
            + (on_cpu_fix if have_gpus == 0 else "Lower num_workers or gpus_per_worker of its groups.")
        )
    num_cpus = ray_args.get("num_cpus")
    if num_cpus is None and need.cpus > machine_cpus:
        errors.append(
            f"stage {name!r} needs {need.cpus:g} CPUs ({groups}) but this machine has {machine_cpus}, and the "
            f"local Ray cluster would oversubscribe them. Use fewer workers (--config 'fiddler:workers(n="
            f"{max(1, machine_cpus)})') or CPUs per worker, run in-process (--config fiddler:local), or "
            f"oversubscribe on purpose with set:runtime.num_cpus={math.ceil(need.cpus)}."
        )
    elif num_cpus is not None and need.cpus > num_cpus:
        errors.append(
            f"stage {name!r} needs {need.cpus:g} CPUs ({groups}) but RayRuntime.num_cpus={num_cpus}: Ray would "
            f"wait forever for the placement. Raise set:runtime.num_cpus={math.ceil(need.cpus)} or use fewer workers."
        )
    elif num_cpus is not None and num_cpus > machine_cpus and need.cpus > machine_cpus:
        warnings.append(
            f"stage {name!r} runs {need.cpus:g} CPUs of workers on a machine with {machine_cpus} (RayRuntime.num_cpus="
            f"{num_cpus}): oversubscribed, each worker will be slower."
        )
    return errors, warnings
