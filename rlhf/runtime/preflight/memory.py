"""The memory planner: every role's peak per device, summed where roles share one, before any model loads.

For each worker group of a stage whose worker class predicts its memory (`predict_memory`, beside
the worker: rlhf.workers.memory), the group's arguments are read from the plan, the model paths
resolved to their config.json (an earlier stage's output has its input model's shape), and the
trainer's settings turned into one rank's `Workload` (prompts per step x n over the data-parallel
ranks, the longest prompt, max new tokens). Colocated groups share rank r's device: their phases
run one after another, so the device's peak is the largest phase of any role plus what every other
role keeps resident (weights, gradients, optimizer state). On a CPU run every group and rank shares
the host's RAM.

A device whose predicted peak exceeds its memory (the GPU's, or the host RAM on a CPU run) is an
error naming the largest consumers and the settings that would fit, each checked by predicting
again with it changed: gradient checkpointing, a token budget, the fused LM head, FSDP CPU offload,
more ranks, a smaller vLLM share, fewer rows per generate call. A GPU run planned on a machine
without one has no device size to compare with: the plan is printed, nothing is refused
(`rlhf plan --memory` answers for a given size).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from collections.abc import Callable, Sequence
from typing import Any

import fiddle as fdl
from rich import box
from rich.console import Console
from rich.table import Table

from rlhf.runtime.plan import Plan, compile_graph, plan_model_path
from rlhf.runtime.preflight.graph import args, get, is_a, nodes, runtime_kind, stage_prefix
from rlhf.rollout.vllm_engine import device_share
from rlhf.trainers.rl import RLTrainer
from rlhf.trainers.dpo import DPOTrainer
from rlhf.trainers.reward_model import RewardModelTrainer
from rlhf.trainers.sft import SFTTrainer
from rlhf.workers.fsdp import FSDP, resolve_strategy
from rlhf.workers.memory import GiB, MemoryEstimate, Phase, Placement, Term, Workload

__all__ = ["DeviceMemory", "MemoryPlan", "devices", "host_memory_bytes", "memory_plan", "memory_table",
           "suggest_fixes"]


@dataclasses.dataclass(frozen=True)
class RolePlan:
    """One group's prediction with what produced it (so a fix can be predicted again)."""

    group: str
    estimate: MemoryEstimate
    predict: Callable[[dict, Workload, Placement], MemoryEstimate]
    arguments: dict
    workload: Workload
    placement: Placement
    path: str  # the group's worker in set: syntax: stages.grpo.policy.worker


@dataclasses.dataclass(frozen=True)
class DeviceMemory:
    """One device (a GPU of rank r of a pool, or the host on a CPU run) and the roles that share it."""

    name: str  # "GPU (policy, critic)" / "host RAM"
    roles: tuple[RolePlan, ...]
    capacity: float | None  # bytes; None: unknown here

    @property
    def peak(self) -> float:
        return device_peak([r.estimate for r in self.roles])[0]

    @property
    def peak_phase(self) -> str:
        return device_peak([r.estimate for r in self.roles])[1]

    def largest(self, k: int = 3) -> list[tuple[str, float]]:
        """The largest terms alive at the peak, with the role they belong to."""
        return largest_terms([r.estimate for r in self.roles], k)


@dataclasses.dataclass
class MemoryPlan:
    """The memory plan of one stage: its devices, notes (roles that could not be predicted), problems."""

    stage: str
    devices: list[DeviceMemory] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    problems: list[str] = dataclasses.field(default_factory=list)


def resident(estimate: MemoryEstimate) -> float:
    """Bytes present in every phase of a role (its weights, gradients, optimizer state)."""
    if not estimate.phases:
        return 0.0
    names = set.intersection(*({t.name for t in p.terms} for p in estimate.phases))
    return sum(t.bytes for t in estimate.phases[0].terms if t.name in names)


def device_peak(estimates: Sequence[MemoryEstimate]) -> tuple[float, str]:
    """(bytes, "role: phase") of a device's peak: one role's phase plus what every other role keeps."""
    best, where = 0.0, ""
    for i, e in enumerate(estimates):
        others = sum(resident(o) for j, o in enumerate(estimates) if j != i)
        for phase in e.phases:
            if phase.bytes + others > best:
                best, where = phase.bytes + others, f"{e.role}: {phase.name}"
    return best, where


def largest_terms(estimates: Sequence[MemoryEstimate], k: int) -> list[tuple[str, float]]:
    _, where = device_peak(estimates)
    role, _, phase = where.partition(": ")
    terms = []
    for e in estimates:
        if e.role == role:
            terms += [(f"{e.role} {t.name}", t.bytes) for t in e.phase(phase).terms]
        else:
            names = set.intersection(*({t.name for t in p.terms} for p in e.phases)) if e.phases else set()
            terms += [(f"{e.role} {t.name}", t.bytes) for t in e.phases[0].terms if t.name in names]
    merged: dict[str, float] = {}
    for name, b in terms:
        merged[name] = merged.get(name, 0.0) + b
    return sorted(merged.items(), key=lambda kv: -kv[1])[:k]


def host_memory_bytes() -> float:
    """This machine's RAM."""
    return float(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def gpu_memory_bytes() -> float | None:
    """The first CUDA device's memory, or None where there is none."""
    import torch

    if not torch.cuda.is_available():
        return None
    return float(torch.cuda.get_device_properties(0).total_memory)


# --------------------------------------------------------------------------- reading the graph
def _stage_models(graph: Any) -> dict[str, str]:
    """stage -> the model it starts from (its output keeps that shape), as `--print_plan` resolves them."""
    out: dict[str, str] = {}
    for name, stage in dict(get(graph, "stages") or {}).items():
        try:
            plan = compile_graph(stage)
        except (TypeError, ValueError):
            continue
        trained = next((group for group in ("policy", "rm") if group in plan.groups), None)  # rm: a reward model
        if trained is not None:
            path = plan_model_path(plan.worker_arguments(trained).get("model_path"), out)
            if path:
                out[name] = path
    return out


def _workload(stage: Any, name: str) -> tuple[Workload | None, str]:
    """One rank's workload before the split over ranks (rows = the whole step's), from the stage's trainer."""
    for node, _ in nodes(stage, stage_prefix(name)):
        if is_a(node, RLTrainer):
            a = args(node)
            sampling, data = a.get("sampling"), a.get("train_data")
            n, new, prompts = get(sampling, "n"), get(sampling, "max_new_tokens"), a.get("prompts_per_step")
            budget = get(a.get("rollout"), "max_response_tokens")  # a multi-turn rollout's (rlhf.agents) responses
            if isinstance(budget, int) and isinstance(new, int):  # hold every turn and observation: that long
                new = max(new, budget)
            width = get(data, "max_prompt_length") if isinstance(data, fdl.Buildable) else None
            numbers = (n, new, prompts, width)
            if not all(isinstance(x, int) and x > 0 for x in numbers):
                return None, "its prompts, samples or lengths are not plain numbers"
            return Workload(width, new, n=n, rows=prompts * n), ""
        if is_a(node, SFTTrainer) or is_a(node, RewardModelTrainer):
            a = args(node)
            data, rows = a.get("data"), a.get("batch_size")
            width = get(data, "max_length") if isinstance(data, fdl.Buildable) else None
            if not all(isinstance(x, int) and x > 0 for x in (rows, width)):
                return None, "its batch size or max_length is not a plain number"
            if is_a(node, DPOTrainer) or is_a(node, RewardModelTrainer):  # batch_size counts pairs: two rows each
                rows *= 2
            return Workload(0, width, n=1, rows=rows, generate=False), ""
    return None, "no RL or SFT trainer"


def _built(arguments: dict) -> dict:
    """Worker arguments with the plain settings built (TrainingSetup, engine factory, objective), others as nodes."""
    out = dict(arguments)
    for key in ("training", "engine"):
        if isinstance(out.get(key), fdl.Buildable):
            out[key] = fdl.build(out[key])
    return out


def role_plans(graph: Any, name: str, stage: Any, gpu_bytes: float | None) -> tuple[list[RolePlan], list[str]]:
    """Each group's prediction for stage `name`, and notes on what could not be predicted."""
    notes: list[str] = []
    try:
        plan = compile_graph(stage)
    except (TypeError, ValueError):
        return [], []  # reported by the other checks
    workload, why = _workload(stage, name)
    if workload is None:
        return [], [f"stage {name!r}: no memory plan ({why})"] if why != "no RL or SFT trainer" else []
    kind, _ = runtime_kind(graph)
    resolve = functools.partial(plan_model_path, stage_models=_stage_models(graph))
    roles = []
    for group in plan.groups.values():
        predict = getattr(group.worker_cls, "predict_memory", None)
        if predict is None:
            continue
        arguments = _built(plan.worker_arguments(group.name))
        unknown = [k for k, v in arguments.items() if k.endswith("model_path") and v is not None and resolve(v) is None]
        if unknown:
            notes.append(f"stage {name!r}: {group.name}'s {', '.join(unknown)} is known only when the stage starts")
            continue
        arguments = {k: resolve(v) if k.endswith("model_path") and v is not None else v for k, v in arguments.items()}
        on_gpu = group.gpus_per_worker > 0
        ranks = 1 if kind == "local" else group.num_workers
        try:
            strategy = resolve_strategy(arguments["training"].strategy, on_gpu)
        except ValueError:
            continue  # reported by the worker's own checks
        fsdp = isinstance(strategy, FSDP)
        placement = Placement("cuda" if on_gpu else "cpu", ranks, fsdp=fsdp,
                              cpu_offload=fsdp and strategy.cpu_offload,
                              device_bytes=gpu_bytes if on_gpu else host_memory_bytes(), process_group=kind != "local")
        rank_load = dataclasses.replace(workload, rows=max(1, math.ceil(workload.rows / ranks)),
                                        generate=workload.generate and group.name == "policy")
        try:
            estimate = predict(arguments, rank_load, placement)
        except (OSError, ValueError) as err:
            notes.append(f"stage {name!r}: no memory plan for {group.name} ({err})")
            continue
        path = f"stages.{name}.{group.name}.worker"
        roles.append(RolePlan(group.name, estimate, predict, arguments, rank_load, placement, path))
    return roles, notes


def devices(plan: Plan | None, roles: list[RolePlan], gpu_bytes: float | None) -> list[DeviceMemory]:
    """GPU roles grouped by the pool they share (colocated groups); CPU roles all on the host."""
    pools: dict[str, list[RolePlan]] = {}
    host: list[RolePlan] = []
    for role in roles:
        if role.placement.device == "cpu":  # every rank of the group peaks at once, on the same host
            host.append(dataclasses.replace(role, estimate=_scaled(role.estimate, role.placement.world_size)))
        else:
            spec = plan.groups[role.group] if plan is not None else None
            pools.setdefault(spec.colocate_with or spec.name if spec else role.group, []).append(role)
    out = [DeviceMemory(f"GPU ({', '.join(r.group for r in members)})", tuple(members), gpu_bytes)
           for members in pools.values()]
    if host:
        out.append(DeviceMemory("host RAM (every worker on this machine)", tuple(host), host_memory_bytes()))
    return out


def _scaled(estimate: MemoryEstimate, k: int) -> MemoryEstimate:
    if k == 1:
        return estimate
    phases = tuple(Phase(p.name, tuple(Term(f"{t.name} x {k} ranks", t.bytes * k) for t in p.terms))
                   for p in estimate.phases)
    return dataclasses.replace(estimate, phases=phases)


def memory_plan(graph: Any, name: str, stage: Any, gpus: int | None = None) -> MemoryPlan:
    """The memory plan of stage `name`: each device's predicted peak; `problems` where it does not fit."""
    gpu_bytes = gpu_memory_bytes() if gpus is None or gpus > 0 else None
    roles, notes = role_plans(graph, name, stage, gpu_bytes)
    result = MemoryPlan(name, notes=notes)
    if not roles:
        return result
    plan = compile_graph(stage)
    result.devices = devices(plan, roles, gpu_bytes)
    for device in result.devices:
        if device.capacity is None or device.peak <= device.capacity:
            continue
        largest = ", ".join(f"{n} {_gb(b)}" for n, b in device.largest(3))
        fixes = suggest_fixes(device)
        advice = ("; ".join(fixes) + ".") if fixes else (
            "no single setting brings it under the limit: combine them, or use a smaller model or more devices.")
        result.problems.append(
            f"stage {name!r}: {device.name} is predicted to peak at {_gb(device.peak)} ({device.peak_phase}) but has "
            f"{_gb(device.capacity)}. Largest: {largest}. What would fit: {advice} (docs/memory.md)"
        )
    return result


# --------------------------------------------------------------------------- fixes
def _fix_candidates(role: RolePlan) -> list[tuple[str, dict, Workload, Placement]]:
    """(the setting as a --config override, arguments, workload, placement) to try, cheapest first."""
    training, out = role.arguments["training"], []
    w, pl, path = role.workload, role.placement, role.path

    def setup(**changes):
        return {**role.arguments, "training": dataclasses.replace(training, **changes)}

    if not training.gradient_checkpointing:
        out.append((f"set:{path}.training.gradient_checkpointing=True", setup(gradient_checkpointing=True), w, pl))
    width = w.tokens
    current = training.max_tokens_per_micro_batch or training.micro_batch_size * width
    budget = current // 2
    while budget >= width:
        out.append((f"set:{path}.training.max_tokens_per_micro_batch={budget}",
                    setup(max_tokens_per_micro_batch=budget, max_tokens_per_forward=budget), w, pl))
        budget //= 2
    if "fused_lm_head" in role.arguments and role.arguments.get("fused_lm_head") is not True:
        out.append((f"set:{path}.fused_lm_head=True", {**role.arguments, "fused_lm_head": True}, w, pl))
    engine = role.arguments.get("engine")
    options = getattr(engine, "keywords", None)
    if w.generate and options is not None and getattr(getattr(engine, "func", None), "sharing", None) is None:
        share = device_share(options.get("gpu_memory_utilization"), pl.device == "cuda")
        for lower in (0.4, 0.3, 0.2):
            if lower < share:
                new = functools.partial(engine.func, *engine.args, **{**options, "gpu_memory_utilization": lower})
                out.append((f"set:{path}.engine.gpu_memory_utilization={lower}", {**role.arguments, "engine": new},
                            w, pl))
    elif w.generate and engine is not None:
        rows = options.get("max_rows_per_call") if options else None
        rows = (rows or w.rows) // 2
        while rows >= max(1, w.n):
            func = getattr(engine, "func", engine)
            new = functools.partial(func, **{**(options or {}), "max_rows_per_call": rows})
            out.append((f"set:{path}.engine.max_rows_per_call={rows}", {**role.arguments, "engine": new}, w, pl))
            rows //= 2
    if pl.device == "cuda" and pl.fsdp and not pl.cpu_offload:
        out.append((f"set:{path}.training.strategy=FSDP(cpu_offload=True) (a fdl.Config of rlhf.workers.fsdp.FSDP)",
                    role.arguments, w, dataclasses.replace(pl, cpu_offload=True)))
    if pl.device == "cuda":
        for ranks in (pl.world_size * 2, pl.world_size * 4):
            rows = max(1, math.ceil(w.rows * pl.world_size / ranks))
            out.append((f"{ranks} FSDP ranks (num_workers={ranks}, strategy='fsdp')", setup(strategy="fsdp"),
                        dataclasses.replace(w, rows=rows), dataclasses.replace(pl, world_size=ranks, fsdp=True)))
    return out


def suggest_fixes(device: DeviceMemory, limit: int = 4) -> list[str]:
    """Settings (one at a time) under which the device's predicted peak fits, with that peak."""
    fixes = []
    for i, role in enumerate(device.roles):
        for label, arguments, workload, placement in _fix_candidates(role):
            try:
                estimate = role.predict(arguments, workload, placement)
            except (OSError, ValueError):
                continue
            estimates = [estimate if j == i else r.estimate for j, r in enumerate(device.roles)]
            peak = device_peak(estimates)[0]
            if device.capacity is not None and peak <= device.capacity:
                fixes.append(f"--config '{label}' ({_gb(peak)})" if label.startswith("set:") else f"{label} "
                             f"({_gb(peak)})")
                if len(fixes) >= limit:
                    return fixes
    return fixes


# --------------------------------------------------------------------------- printing
def _gb(b: float) -> str:
    return f"{b / GiB:.2f} GB" if b >= GiB / 10 else f"{b / 2**20:.1f} MB"


def memory_table(plans: Sequence[MemoryPlan]) -> str:
    """One row per device and stage: the roles, the phase at the peak, `peak memory`, the device's size,
    and the largest terms."""
    table = Table(title="memory per device (predicted from the model configs, per rank)", title_justify="left",
                  box=box.SIMPLE_HEAD)
    for column in ("stage", "device", "at", "peak memory", "of", "largest terms"):
        table.add_column(column, justify="right" if column in ("peak memory", "of") else "left")
    notes = []
    for plan in plans:
        for device in plan.devices:
            size = _gb(device.capacity) if device.capacity is not None else "?"
            flag = " (!)" if device.capacity is not None and device.peak > device.capacity else ""
            largest = ", ".join(f"{n} {_gb(b)}" for n, b in device.largest(3))
            table.add_row(plan.stage, device.name, device.peak_phase, _gb(device.peak) + flag, size, largest)
        notes += plan.notes
    if not any(p.devices for p in plans):
        return "\n".join(notes)
    console = Console(width=200, record=True, file=open(os.devnull, "w"))
    console.print(table)
    text = "\n".join(line.rstrip() for line in console.export_text().rstrip().splitlines())
    return "\n".join([text, *notes])
