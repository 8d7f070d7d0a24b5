"""Compile an experiment graph into a `Plan`: the driver graph plus one spec per worker group.

The graph is walked unbuilt (fiddle's memoized traversal, so a shared node is visited once);
every `Remote` node is replaced by a `GroupRef`, and its worker sub-graph is serialised to
fiddle JSON. Workers rebuild their sub-graph from that JSON, in every runtime, so what runs
in a Ray actor is exactly what the Plan records. Groups that could never be placed together
(colocation chains, a colocated group whose ranks or GPUs do not match its owner's:
`rlhf.runtime.placement`) are refused here, so preflight reports them before anything starts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import fiddle as fdl
from fiddle import daglish

from rlhf.graph.io import from_json, to_json
from rlhf.runtime.group_spec import GroupSpec
from rlhf.runtime.placement import placement_problems, placements
from rlhf.runtime.remote import GroupRef, Remote, StageOutput

__all__ = ["GroupSpec", "Plan", "bind_groups", "compile_graph", "plan_model_path"]


@dataclasses.dataclass(frozen=True)
class Plan:
    """What runs where: the driver's graph (with GroupRefs) and the worker groups."""

    driver: Any
    groups: dict[str, GroupSpec]

    def describe(self, resolve: Callable[[Any], Any] | None = None) -> str:
        """What runs where; with `resolve` (a model path node -> a folder, or None when unknown),
        workers that describe their placement add the strategy and parameter bytes per rank."""
        lines = [f"driver: {_callable_name(self.driver)}"]
        where_placed = placements(self.groups)
        for g in self.groups.values():
            where = f", colocated with {g.colocate_with}" if g.colocate_with else ""
            share = where_placed[g.name].num_gpus
            if share != g.gpus_per_worker:
                where += f", {share:g} GPU per actor: the bundle is shared"
            lines.append(
                f"group {g.name}: {g.num_workers} x {g.worker_cls.__name__} "
                f"(cpus {g.cpus_per_worker}, gpus {g.gpus_per_worker} per worker{where})"
            )
            placement = getattr(g.worker_cls, "describe_placement", None)  # strategy and shard sizes
            if placement is not None:
                arguments = self.worker_arguments(g.name)
                for cheap in ("training", "engine"):  # plain settings and engine factories: cheap to build
                    if isinstance(arguments.get(cheap), fdl.Buildable):
                        arguments[cheap] = fdl.build(arguments[cheap])
                if resolve is not None:
                    arguments = {k: resolve(v) if k.endswith("model_path") else v for k, v in arguments.items()}
                lines.append(f"  {placement(arguments, g.num_workers, g.gpus_per_worker > 0)}")
        lines.extend(self._driver_lines())
        return "\n".join(lines)

    def _driver_lines(self) -> list[str]:
        """Lines from driver-side nodes that say how they use the groups (a node whose callable has
        `describe_plan(arguments, groups)`, e.g. the asynchronous rollout's placement and mode)."""
        lines: list[str] = []

        def visit(value: Any, state: daglish.State) -> Any:
            describe = getattr(fdl.get_callable(value), "describe_plan", None) if isinstance(value, fdl.Buildable) \
                else None
            if describe is not None:
                lines.append(describe(fdl.ordered_arguments(value, include_defaults=True), self.groups))
            return state.map_children(value)

        daglish.MemoizedTraversal.run(visit, self.driver)
        return lines

    def worker_arguments(self, group: str) -> dict[str, Any]:
        """A group's worker arguments, defaults included (nodes stay unbuilt)."""
        return fdl.ordered_arguments(from_json(self.groups[group].worker_json), include_defaults=True)


def plan_model_path(value: Any, stage_models: dict[str, str]) -> str | None:
    """A model path as far as it is known before a run: a string as given; an earlier stage's
    output as that stage's input model (training keeps the architecture); a node that makes a
    model folder (a tiny local model) built, as the run would; None otherwise."""
    if isinstance(value, str):
        return value
    if isinstance(value, fdl.Buildable) and fdl.get_callable(value) is StageOutput:
        return stage_models.get(value.stage)
    if isinstance(value, fdl.Buildable):
        built = fdl.build(value)
        return built if isinstance(built, str) else None
    return None


def _callable_name(node: Any) -> str:
    if isinstance(node, fdl.Buildable):
        fn = fdl.get_callable(node)
        return f"{fn.__module__}.{fn.__qualname__}"
    return type(node).__name__


def compile_graph(graph: Any) -> Plan:
    """Cut `graph` at its `Remote` nodes. The input graph is not modified."""
    groups: dict[str, GroupSpec] = {}

    def cut(value: Any, state: daglish.State) -> Any:
        if isinstance(value, fdl.Buildable) and fdl.get_callable(value) is Remote:
            args = fdl.ordered_arguments(value, include_defaults=True)
            name = args["name"]
            worker = args["worker"]
            if not isinstance(worker, fdl.Buildable):
                raise TypeError(f"Remote {name!r}: `worker` must be a fdl.Config, got {type(worker).__name__}")
            spec = GroupSpec(
                name=name,
                worker_json=to_json(worker),
                num_workers=int(args["num_workers"]),
                cpus_per_worker=float(args["cpus_per_worker"]),
                gpus_per_worker=float(args["gpus_per_worker"]),
                colocate_with=args["colocate_with"],
            )
            if name in groups and groups[name] != spec:
                raise ValueError(f"two different Remote nodes are both named {name!r}; give each group its own name")
            groups[name] = spec
            return fdl.Config(GroupRef, name=name)
        return state.map_children(value)

    driver = daglish.MemoizedTraversal.run(cut, graph)
    for spec in groups.values():
        if spec.colocate_with and spec.colocate_with not in groups:
            raise ValueError(
                f"group {spec.name!r} is colocated with {spec.colocate_with!r}, which is not a group of this "
                f"graph (groups: {sorted(groups)})"
            )
    problems = placement_problems(groups)
    if problems:
        raise ValueError("the worker groups cannot be placed:\n" + "\n".join(f"- {p}" for p in problems))
    return Plan(driver=driver, groups=groups)


def bind_groups(driver: Any, handles: dict[str, Any]) -> Any:
    """The driver graph with every `GroupRef` replaced by the live worker group."""

    def swap(value: Any, state: daglish.State) -> Any:
        if isinstance(value, fdl.Buildable) and fdl.get_callable(value) is GroupRef:
            return handles[value.name]
        return state.map_children(value)

    return daglish.MemoizedTraversal.run(swap, driver)
