"""Where each worker group's actors go: resource pools, bundles, and the share of a bundle each actor asks.

A group without `colocate_with` owns a resource pool: one placement-group bundle per rank,
holding that rank's CPUs and GPUs. A group colocated with it puts its rank r in the owner's
bundle r, so policy rank r and critic rank r run on the same GPU.

The GPU split: every group of a pool that asks for GPUs gets an equal fraction of the
bundle's GPU. A bundle of 1 GPU shared by policy and critic gives each actor 0.5 GPU; with a
reward model too, 1/3 each (rounded down to Ray's 1e-4 resolution so the shares fit). The
bundle is not sized to the sum: colocation means the roles share one device (verl and
OpenRLHF give colocated actors 1/n of a bundle's GPU for the same reason). Ray only
time-shares a GPU in fractions of one GPU (an actor asking 1.0 of a 2-GPU bundle gets a
different device than its neighbour), so a pool whose bundles hold more than one GPU cannot
be shared. The fraction is Ray's bookkeeping only; memory is shared as the roles use it.

CPUs are not split: the owner's actors ask the bundle's CPUs, colocated actors ask none
(they run in the same bundle and time-share its cores; their `cpus_per_worker` still sets
their torch threads).

Everything here is checked before any actor starts: `placement_problems` (the plan's own
consistency; `compile_graph` raises on it, so preflight reports it) and `cluster_problems`
(against the nodes of the cluster the runtime joins).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

from rlhf.runtime.group_spec import GroupSpec

RESOLUTION = 1e-4  # Ray's granularity for fractional resources


class PlacementError(RuntimeError):
    """A worker group cannot be placed, or was not placed in time; the message names the group and the fix."""


@dataclasses.dataclass(frozen=True)
class Placement:
    """What one group's actors ask Ray for, and the bundles they ask it from."""

    group: str
    pool: str  # the group owning the bundles
    bundle: dict[str, float]  # one bundle per rank: {"CPU": c, "GPU": g}
    num_cpus: float  # per actor, taken from its bundle
    num_gpus: float  # per actor, taken from its bundle

    def describe(self) -> str:
        return (f"{_fmt(self.num_cpus)} CPU + {_fmt(self.num_gpus)} GPU per actor from bundles "
                f"{format_resources(self.bundle)} of pool {self.pool!r}")


def _fmt(x: float) -> str:
    return f"{x:g}"


def format_resources(resources: Mapping[str, float]) -> str:
    return "{" + ", ".join(f"{k}: {_fmt(v)}" for k, v in resources.items()) + "}"


def pool_members(groups: Mapping[str, GroupSpec]) -> dict[str, list[GroupSpec]]:
    """Groups per pool, the owner first."""
    pools: dict[str, list[GroupSpec]] = {}
    for spec in sorted(groups.values(), key=lambda g: g.colocate_with is not None):
        pools.setdefault(spec.pool, []).append(spec)
    return pools


def placement_problems(groups: Mapping[str, GroupSpec]) -> list[str]:
    """Why the groups cannot all be placed, whatever the cluster (empty when they can)."""
    problems = []
    for spec in groups.values():
        target = spec.colocate_with
        if target is None:
            continue
        fix_drop = f"or drop colocate_with to give {spec.name!r} its own resources"
        if target == spec.name:
            problems.append(f"group {spec.name!r} is colocated with itself; remove colocate_with")
            continue
        owner = groups.get(target)
        if owner is None:
            continue  # compile_graph reports unknown groups itself
        if owner.colocate_with is not None:
            problems.append(
                f"group {spec.name!r} is colocated with {target!r}, which is itself colocated with "
                f"{owner.colocate_with!r}: colocate every group with the group that owns the resources "
                f"(colocate_with={owner.colocate_with!r})"
            )
            continue
        if spec.num_workers != owner.num_workers:
            problems.append(
                f"group {spec.name!r} has {spec.num_workers} workers but is colocated with {target!r}, which has "
                f"{owner.num_workers}: its rank r runs in bundle r of {target!r}, so set "
                f"num_workers={owner.num_workers} ({fix_drop})"
            )
        if spec.gpus_per_worker > 0 and owner.gpus_per_worker == 0:
            problems.append(
                f"group {spec.name!r} asks {_fmt(spec.gpus_per_worker)} GPU per worker but is colocated with "
                f"{target!r}, whose bundles hold no GPU: Ray would never place it. Set gpus_per_worker=0 on "
                f"{spec.name!r}, give {target!r} GPUs, {fix_drop}"
            )
        elif spec.gpus_per_worker > 0 and spec.gpus_per_worker != owner.gpus_per_worker:
            problems.append(
                f"group {spec.name!r} asks {_fmt(spec.gpus_per_worker)} GPU per worker but is colocated with "
                f"{target!r}, whose workers use {_fmt(owner.gpus_per_worker)}: colocated groups share the owner's "
                f"GPUs, so set gpus_per_worker={_fmt(owner.gpus_per_worker)} (or 0 for a CPU-only role), {fix_drop}"
            )
        if spec.gpus_per_worker > 0 and owner.gpus_per_worker > 1:
            problems.append(
                f"group {spec.name!r} is colocated with {target!r}, whose workers hold {_fmt(owner.gpus_per_worker)} "
                f"GPUs each: Ray shares a GPU between actors only in fractions of one GPU. Use at most 1 GPU per "
                f"worker in a colocated pool, {fix_drop}"
            )
    return problems


def placements(groups: Mapping[str, GroupSpec]) -> dict[str, Placement]:
    """Each group's placement (call on groups without `placement_problems`)."""
    out = {}
    for pool, members in pool_members(groups).items():
        owner = members[0]
        bundle = {"CPU": owner.cpus_per_worker}
        if owner.gpus_per_worker:
            bundle["GPU"] = owner.gpus_per_worker
        gpu_users = [m for m in members if m.gpus_per_worker > 0]
        share = owner.gpus_per_worker / len(gpu_users) if gpu_users else 0.0
        if len(gpu_users) > 1:
            steps = round(1 / RESOLUTION)
            share = math.floor(share * steps + 1e-9) / steps  # rounded down: n shares must fit the bundle
        for m in members:
            out[m.name] = Placement(
                group=m.name,
                pool=pool,
                bundle=dict(bundle),
                num_cpus=owner.cpus_per_worker if m is owner else 0.0,
                num_gpus=share if m.gpus_per_worker > 0 else 0.0,
            )
    return out


def cluster_problems(groups: Mapping[str, GroupSpec], nodes: Sequence[Mapping[str, float]]) -> list[str]:
    """Why the groups cannot be placed on a cluster whose alive nodes have `nodes` resources in total
    (each a dict like {"CPU": 8, "GPU": 4}): a bundle no node can hold, or more than the cluster has."""
    problems = []
    totals = {k: sum(n.get(k, 0.0) for n in nodes) for k in ("CPU", "GPU")}
    need = {"CPU": 0.0, "GPU": 0.0}
    for pool, members in pool_members(groups).items():
        owner = members[0]
        bundle = placements({m.name: m for m in members})[owner.name].bundle
        names = ", ".join(repr(m.name) for m in members)
        if not any(all(n.get(k, 0.0) >= v for k, v in bundle.items()) for n in nodes):
            biggest = max(nodes, key=lambda n: (n.get("GPU", 0.0), n.get("CPU", 0.0)), default={})
            largest = format_resources({k: biggest.get(k, 0.0) for k in bundle})
            problems.append(
                f"group {owner.name!r} (pool of {names}) asks {format_resources(bundle)} per worker, more than any "
                f"node of the cluster holds (largest: {largest}): one worker's bundle must fit on one node. Lower "
                f"cpus_per_worker/gpus_per_worker of {owner.name!r} or add bigger nodes"
            )
        for k, v in bundle.items():
            need[k] += v * owner.num_workers
    short = {k: v for k, v in need.items() if v > totals[k]}
    if short:
        listing = ", ".join(
            f"{g.name}: {g.num_workers} x ({_fmt(g.cpus_per_worker)} CPU, {_fmt(g.gpus_per_worker)} GPU)"
            for g in groups.values() if g.colocate_with is None
        )
        problems.append(
            f"the groups need {format_resources(need)} in all ({listing}; colocated groups use their owner's "
            f"bundles) but the cluster has {format_resources(totals)}: lower num_workers or the resources per "
            f"worker, or add nodes"
        )
    return problems
