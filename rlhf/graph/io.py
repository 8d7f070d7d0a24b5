"""A fiddle graph as data: JSON round trip, a deterministic hash, and flat params for Aim.

- `to_json` / `from_json`: fiddle's own JSON format (`fiddle.experimental.serialization`); shared
  nodes stay shared. This is the lineage format stored with every run.
- `graph_hash`: sha256 of a canonical form of the graph, equal in every process. fiddle's JSON is
  not hashed as-is: its object keys and recorded paths follow argument insertion order, and set
  elements come out in hash-seed order.
- `flatten` / `nest`: every leaf as `{"stages.rl.policy.lr": 1e-6}`, and back to nested dicts, so
  Aim's UI can group runs by `run.params.graph.<path>`.
- `make_experiments_importable`: a graph built by an experiment file names callables of a module
  named after that file (`arithmetic_tiny.tiny_reward`); `from_json` in another process (a sweep
  member, `rlhf rerun`) finds it when the working directory or its `experiments/` is on `sys.path`.

`graph_hash` and `flatten` look at the graph with every defaulted argument materialized
(`fdl.materialize_defaults` on a copy): setting an argument to its default changes neither.
This module knows no components: only fiddle's graph types.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import hashlib
import json
import math
import os
import sys
from typing import Any

import fiddle as fdl
from fiddle import daglish
from fiddle.experimental import serialization

__all__ = ["to_json", "from_json", "graph_hash", "flatten", "nest", "shared_node_paths", "make_experiments_importable"]

_PRIMITIVES = (bool, int, float, str, type(None))
# Factories of dataclass fields that are called rather than named when defaults are materialized:
# `field(default_factory=list)` then reads as `[]`, the same as setting `[]` explicitly.
_TRIVIAL_FACTORIES = (list, dict, tuple)


def to_json(cfg: fdl.Buildable) -> str:
    """Serializes `cfg` with fiddle's JSON format (shared nodes stay shared; no argument history)."""
    return serialization.dump_json(cfg)


def from_json(s: str) -> fdl.Buildable:
    """Inverse of `to_json`: `from_json(to_json(cfg)) == cfg`, sharing included."""
    return serialization.load_json(s)


def make_experiments_importable() -> None:
    """Callables defined in experiment files live in modules named after the file (`arithmetic_tiny`):
    put the working directory and its `experiments/` folder on `sys.path` so `from_json` finds them."""
    for folder in (os.getcwd(), os.path.join(os.getcwd(), "experiments")):
        if os.path.isdir(folder) and folder not in sys.path:
            sys.path.append(folder)


def graph_hash(cfg: Any) -> str:
    """sha256 hex digest of the graph, identical across processes and `PYTHONHASHSEED`s.

    What counts: every Buildable's kind (Config, Partial, ...), callable ("module.qualname"),
    arguments with defaults materialized (so an explicit default hashes like an unset argument),
    tags, and which Buildable nodes are shared (a shared node builds one object, two equal nodes
    build two). What does not: argument order, argument history (file:line), object ids.

    Raises:
      TypeError: for a set/frozenset anywhere in the graph (iteration order differs between
        processes: use a sorted tuple), for a lambda or local function (it has no importable
        name), or for an object whose only repr is its memory address.
    """
    canonical = _Canonicalizer().canon(_materialized(cfg), "<root>")
    text = json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def flatten(cfg: Any) -> dict[str, object]:
    """The graph as `{"dotted.path": value}` for every leaf, defaults materialized.

    Paths join attribute names, dict keys and list indices with dots (`stages.rl.policy.lr`,
    `items.0`); a dict key containing a dot would nest one level too deep in `nest`. Each
    Buildable node also contributes `"<path>.__fn__": "module.qualname"` (the root's is just
    `"__fn__"`). A sequence of primitives is one leaf holding a list; empty containers are leaves
    too (`[]`, `{}`). Callables and classes become their "module.qualname" string, enums
    "module.Enum.MEMBER", sets a sorted list, anything else its `repr`.

    A shared Buildable node appears under its first path only: the shortest one, ties broken by
    sorted names, so the choice does not depend on the order arguments were set in. (Shared
    lists or dicts, which build no shared object, appear under every path.)
    """
    root = _materialized(cfg)
    paths_by_id = daglish.collect_paths_by_id(root, memoizable_only=True)
    out: dict[str, object] = {}

    def visit(value: Any, state: daglish.State) -> None:
        path = _dotted(state.current_path)
        if isinstance(value, fdl.Buildable):
            if state.current_path != min(paths_by_id[id(value)], key=_path_order):
                return
            out[_join(path, "__fn__")] = _qualname(fdl.get_callable(value))
        elif isinstance(value, (set, frozenset)):
            out[path] = sorted((_leaf(v) for v in value), key=repr)
            return
        elif isinstance(value, (list, tuple)) and all(isinstance(v, _PRIMITIVES) for v in value):
            out[path] = [_leaf(v) for v in value]
            return
        elif isinstance(value, dict) and not value:
            out[path] = {}
            return
        elif not state.is_traversable(value):
            out[path] = _leaf(value)
            return
        for _ in state.yield_map_child_values(value):
            pass  # runs the lazy traversal of the children

    daglish.BasicTraversal.run(visit, root)
    return out


def shared_node_paths(cfg: Any) -> dict[str, list[str]]:
    """Every Buildable node reachable by more than one path: its `flatten` path -> all its dotted paths.

    `flatten` lists a shared node's leaves under one path only (the shortest); this says where else
    the same node is used, e.g. that the model node under `data.tokenizer.name_or_path` is also
    `policy.worker.model_path`.
    """
    root = _materialized(cfg)
    out: dict[str, list[str]] = {}
    for value_id, paths in daglish.collect_paths_by_id(root, memoizable_only=True).items():
        if len(paths) > 1:
            ordered = sorted(paths, key=_path_order)
            out[_dotted(ordered[0])] = [_dotted(p) for p in ordered]
    return {k: v for k, v in out.items() if k}  # the root is never shared


def nest(flat: dict[str, object]) -> dict:
    """Dotted keys to nested dicts: `{"a.b": 1, "a.c": 2}` -> `{"a": {"b": 1, "c": 2}}`."""
    nested: dict = {}
    for key, value in flat.items():
        *parents, last = key.split(".")
        node = nested
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ValueError(f"nest: {key!r} goes below the leaf {part!r}")
        if isinstance(node.get(last), dict) and not isinstance(value, dict):
            raise ValueError(f"nest: {key!r} is both a leaf and a prefix of other keys")
        node[last] = value
    return nested


def _materialized(cfg: Any) -> Any:
    """A deep copy of `cfg` with every defaulted argument set explicitly.

    `fdl.materialize_defaults` writes dataclasses' `<factory>` marker for a `default_factory`
    field; that marker is replaced by what building would produce: the value itself for trivial
    factories (`list`, `dict`, `tuple`), else `fdl.Config(factory)`.
    """
    cfg = copy.deepcopy(cfg)
    fdl.materialize_defaults(cfg)
    factory_marker = getattr(dataclasses, "_HAS_DEFAULT_FACTORY", None)
    if factory_marker is None:
        return cfg
    nodes = [node for node, _ in daglish.iterate(cfg) if isinstance(node, fdl.Buildable)]
    for node in nodes:
        fn = fdl.get_callable(node)
        if not (isinstance(fn, type) and dataclasses.is_dataclass(fn)):
            continue
        factories = {f.name: f.default_factory for f in dataclasses.fields(fn)}
        for name, value in list(node.__arguments__.items()):
            if value is factory_marker:
                factory = factories[name]
                setattr(node, name, factory() if factory in _TRIVIAL_FACTORIES else fdl.Config(factory))
    return cfg


class _Canonicalizer:
    """Turns a graph into plain JSON data that is independent of the process and of insertion order.

    Buildables are numbered in the order a sorted depth-first walk first meets them; a later
    meeting of the same node is `{"ref": n}`. Every scalar carries its type so that `1`, `1.0`,
    `True` and `"1"` differ.
    """

    def __init__(self) -> None:
        self.ids: dict[int, int] = {}

    def canon(self, value: Any, path: str) -> Any:
        if isinstance(value, fdl.Buildable):
            return self._buildable(value, path)
        if isinstance(value, bool):
            return {"bool": value}
        if isinstance(value, int) and type(value) is int:
            return {"int": str(value)}
        if isinstance(value, float) and type(value) is float:
            return {"float": repr(value)}
        if isinstance(value, str) and type(value) is str:
            return {"str": value}
        if value is None:
            return {"none": None}
        if isinstance(value, enum.Enum):
            return {"enum": f"{_qualname(type(value))}.{value.name}"}
        if isinstance(value, (set, frozenset)):
            raise TypeError(
                f"graph_hash: a {type(value).__name__} at {path}: set iteration order differs "
                "between processes; use a sorted tuple instead"
            )
        if isinstance(value, tuple) and hasattr(value, "_fields"):
            return {
                "namedtuple": _qualname(type(value)),
                "fields": {f: self.canon(getattr(value, f), f"{path}.{f}") for f in value._fields},
            }
        if type(value) in (list, tuple):
            return {type(value).__name__: [self.canon(v, f"{path}[{i}]") for i, v in enumerate(value)]}
        if isinstance(value, dict):
            items = [
                (self.canon(k, f"{path}<key>"), self.canon(v, f"{path}[{k!r}]")) for k, v in value.items()
            ]
            items.sort(key=lambda kv: json.dumps(kv[0], sort_keys=True))
            return {_qualname(type(value)): items}
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return {
                "dataclass": _qualname(type(value)),
                "fields": {
                    f.name: self.canon(getattr(value, f.name), f"{path}.{f.name}")
                    for f in dataclasses.fields(value)
                },
            }
        if callable(value) and hasattr(value, "__qualname__"):
            return {"callable": _importable_name(value, path)}
        if isinstance(value, bytes):
            return {"bytes": value.hex()}
        text = repr(value)
        if " at 0x" in text:
            raise TypeError(
                f"graph_hash: {type(value).__name__} at {path} has no stable representation "
                f"({text}); put a fdl.Config of it in the graph instead"
            )
        return {"repr": [_qualname(type(value)), text]}

    def _buildable(self, node: fdl.Buildable, path: str) -> Any:
        if id(node) in self.ids:
            return {"ref": self.ids[id(node)]}
        self.ids[id(node)] = len(self.ids)
        arguments = node.__arguments__
        # Positional arguments (of `*args`) have int names: they keep their order, before keywords.
        names = sorted(arguments, key=lambda n: (0, n, "") if isinstance(n, int) else (1, 0, n))
        return {
            "node": self.ids[id(node)],
            "kind": _qualname(type(node)),
            "fn": _importable_name(fdl.get_callable(node), path),
            "args": [[str(n), self.canon(arguments[n], f"{path}.{n}")] for n in names],
            "tags": {
                str(n): sorted(tag.name for tag in tags)
                for n, tags in sorted(node.__argument_tags__.items(), key=lambda nt: str(nt[0]))
                if tags
            },
        }


def _qualname(obj: Any) -> str:
    module = getattr(obj, "__module__", None) or type(obj).__module__
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None) or repr(obj)
    return f"{module}.{name}"


def _importable_name(fn: Any, path: str) -> str:
    name = _qualname(fn)
    if "<lambda>" in name or "<locals>" in name:
        raise TypeError(
            f"graph_hash: {name} at {path} is a lambda or local function; "
            "define it at module level so the graph can name (and serialize) it"
        )
    return name


def _leaf(value: Any) -> object:
    """A value Aim can store as a param."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, _PRIMITIVES):
        return value
    if isinstance(value, enum.Enum):
        return f"{_qualname(type(value))}.{value.name}"
    if isinstance(value, type) or callable(value) and hasattr(value, "__qualname__"):
        return _qualname(value)
    return repr(value)


def _element_name(element: daglish.PathElement) -> str:
    if isinstance(element, daglish.Attr):
        return element.name
    if isinstance(element, daglish.Index):
        return str(element.index)
    if isinstance(element, daglish.Key):
        return str(element.key)
    return element.code


def _element_order(element: daglish.PathElement) -> tuple:
    if isinstance(element, daglish.Index):
        return (0, element.index, "")
    return (1, 0, _element_name(element))


def _path_order(path: daglish.Path) -> tuple:
    return (len(path), tuple(_element_order(e) for e in path))


def _dotted(path: daglish.Path) -> str:
    return ".".join(_element_name(e) for e in path)


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name
