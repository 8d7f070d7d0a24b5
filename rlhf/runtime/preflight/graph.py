"""Reading an experiment graph for the checks: nodes with their `set:` paths, arguments with defaults, stages.

Every check of the preflight walks the unbuilt graph the same way; these helpers are that walk.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import fiddle as fdl
from fiddle import daglish

from rlhf.runtime.local import LocalRuntime
from rlhf.runtime.ray_runtime import RayRuntime

__all__ = ["args", "callable_of", "cli_path", "get", "is_a", "nodes", "runtime_kind", "selected_stages", "stage_prefix"]


def is_a(node: Any, cls: type) -> bool:
    """Whether `node` is an unbuilt graph node whose callable is `cls` or a subclass of it."""
    if not isinstance(node, fdl.Buildable):
        return False
    fn = fdl.get_callable(node)
    return isinstance(fn, type) and issubclass(fn, cls)


def args(node: fdl.Buildable) -> dict[str, Any]:
    """A node's arguments, the signature's defaults included."""
    return fdl.ordered_arguments(node, include_defaults=True)


def get(value: Any, name: str) -> Any:
    """An argument of a node (with its default), or an attribute of a built default object."""
    if isinstance(value, fdl.Buildable):
        return args(value).get(name)
    return getattr(value, name, None)


def callable_of(value: Any) -> Any:
    return fdl.get_callable(value) if isinstance(value, fdl.Buildable) else type(value)


def cli_path(path: daglish.Path) -> str:
    """A daglish path in `set:` syntax: `stages.grpo.policy.worker.model_path`."""
    out = ""
    for element in path:
        if isinstance(element, daglish.Attr):
            out += f".{element.name}"
        elif isinstance(element, daglish.Key) and isinstance(element.key, str) and element.key.isidentifier():
            out += f".{element.key}"
        elif isinstance(element, daglish.Key):
            out += f"[{element.key!r}]"
        elif isinstance(element, daglish.Index):
            out += f"[{element.index}]"
        else:
            out += element.code
    return out.lstrip(".")


def nodes(root: Any, prefix: daglish.Path = ()) -> list[tuple[fdl.Buildable, daglish.Path]]:
    """Every Buildable under `root` once (its first path), with its path from the experiment root."""
    seen: set[int] = set()
    out = []
    for value, path in daglish.iterate(root):
        if isinstance(value, fdl.Buildable) and id(value) not in seen:
            seen.add(id(value))
            out.append((value, (*prefix, *path)))
    return out


def stage_prefix(name: str) -> daglish.Path:
    return (daglish.Attr("stages"), daglish.Key(name))


def graph_nodes(graph: Any, selected: dict[str, Any]) -> list[tuple[fdl.Buildable, daglish.Path]]:
    """The root, every node of the stages that will run, and of the root's other arguments (runtime, ...)."""
    found = [(graph, ())] if isinstance(graph, fdl.Buildable) else []  # the root itself, not all below it
    for name, stage in selected.items():
        found += nodes(stage, stage_prefix(name))
    if isinstance(graph, fdl.Buildable):
        for key, value in graph.__arguments__.items():
            if key != "stages":
                found += nodes(value, (daglish.Attr(key),))
    return found


def selected_stages(graph: Any, stages: Sequence[str] | None, errors: list[str]) -> dict[str, Any]:
    """The stages that will run, by name; a name the graph does not have is added to `errors`."""
    all_stages = dict(get(graph, "stages") or {})
    if stages is None:
        return all_stages
    unknown = [s for s in stages if s not in all_stages]
    if unknown:
        errors.append(
            f"--stages names {', '.join(map(repr, unknown))}, which the experiment does not have. "
            f"Its stages are: {', '.join(all_stages)}."
        )
    return {k: v for k, v in all_stages.items() if k in stages}


def runtime_kind(graph: Any) -> tuple[str, dict[str, Any]]:
    """("local" | "ray" | "other", the runtime's arguments) of an Experiment graph."""
    runtime = get(graph, "runtime")
    if runtime is None or is_a(runtime, LocalRuntime):
        return "local", {}
    if is_a(runtime, RayRuntime):
        return "ray", args(runtime)
    return "other", {}
