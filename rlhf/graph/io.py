"""A fiddle graph as data: JSON round trip, a deterministic hash, and flat params for Aim.

- `to_json` / `from_json`: fiddle's own JSON format (`fiddle.experimental.serialization`); shared
  nodes stay shared. This is the lineage format stored with every run.
- `graph_hash`: sha256 of a canonical form of the graph, equal in every process. fiddle's JSON is
  not hashed as-is: its object keys and recorded paths follow argument insertion order, and set
  elements come out in hash-seed order.
- `flatten` / `nest`: every leaf as `{"stages.rl.policy.lr": 1e-6}`, and back to nested dicts, so
  Aim's UI can group runs by `run.params.graph.<path>`.
- Callables defined in an experiment file or a script (a user-written reward, say) live in a module
  that no import statement can find in a later process (`rlhf rerun`, `rlhf diff`, a Ray worker, a
  sweep member started elsewhere). `to_json` records the source file of every such module beside
  fiddle's data (`"rlhf_sources": {"smollm2_arithmetic": "/abs/experiments/smollm2_arithmetic.py"}`),
  and `from_json` loads a module from its recorded file when it is not loaded already, `__main__`
  included (a graph built by `python my_script.py`). `make_experiments_importable` is the fallback
  for graphs stored before the files were recorded: the working directory and its `experiments/`.

`graph_hash` and `flatten` look at the graph with every defaulted argument materialized
(`fdl.materialize_defaults` on a copy): setting an argument to its default changes neither.
This module knows no components: only fiddle's graph types.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import hashlib
import importlib.util
import json
import math
import os
import sys
import sysconfig
import types
from collections.abc import Iterator
from typing import Any

import fiddle as fdl
from fiddle import daglish
from fiddle.experimental import serialization

__all__ = ["to_json", "from_json", "graph_hash", "flatten", "nest", "shared_node_paths", "make_experiments_importable",
           "GraphSourceError"]

_PRIMITIVES = (bool, int, float, str, type(None))
# Factories of dataclass fields that are called rather than named when defaults are materialized:
# `field(default_factory=list)` then reads as `[]`, the same as setting `[]` explicitly.
_TRIVIAL_FACTORIES = (list, dict, tuple)


_SOURCES_KEY = "rlhf_sources"  # beside fiddle's own keys (fiddle reads only "root" and "objects")


class GraphSourceError(ImportError):
    """A stored graph names a callable whose module can neither be imported nor loaded from its recorded file."""


def to_json(cfg: fdl.Buildable) -> str:
    """Serializes `cfg` with fiddle's JSON format (shared nodes stay shared; no argument history), plus the
    source file of every module of the graph's callables that only its file can bring back (see above)."""
    data = json.loads(serialization.dump_json(cfg))
    sources = {name: file for name in sorted(set(_pyref_modules(data))) if (file := _script_file(name))}
    if sources:
        data[_SOURCES_KEY] = sources
    return json.dumps(data)


def from_json(s: str) -> fdl.Buildable:
    """Inverse of `to_json`: `from_json(to_json(cfg)) == cfg`, sharing included. Modules recorded with their
    source file are loaded from it first where they are not loaded yet (a graph stored by another process)."""
    data = json.loads(s)
    renames = _load_sources(data.pop(_SOURCES_KEY, {}))
    if renames:
        for ref in _pyrefs(data):
            ref["module"] = renames.get(ref["module"], ref["module"])
    try:
        return serialization.load_json(json.dumps(data))
    except (ImportError, AttributeError) as err:
        raise GraphSourceError(
            f"the graph names a callable that cannot be found here: {err}. A graph records the files of the "
            "experiments and scripts it was built from (rlhf_sources); graphs stored before that are found "
            "when the experiment file is in the working directory or its experiments/ folder."
        ) from err


def _pyrefs(data: Any) -> Iterator[dict]:
    """Every `{"type": "pyref", "module": ..., "name": ...}` in fiddle's JSON data (callables, types, enums)."""
    stack = [data]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            if value.get("type") == "pyref" and "module" in value:
                yield value
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)


def _pyref_modules(data: Any) -> Iterator[str]:
    return (ref["module"] for ref in _pyrefs(data))


def _library_dirs() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    return tuple(os.path.realpath(paths[k]) + os.sep for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths)


def _script_file(name: str) -> str | None:
    """The source file of module `name` when only that file can bring it back in another process: a stand-alone
    module (no package, so not `rlhf...` or `torch...`) outside the interpreter's own and installed libraries,
    such as an experiment file loaded by `rlhf run` or the `__main__` of `python my_script.py`."""
    module = sys.modules.get(name)
    if module is None or "." in name or hasattr(module, "__path__"):
        return None
    file = getattr(module, "__file__", None)
    if not isinstance(file, str) or not file.endswith(".py") or not os.path.isfile(file):
        return None
    file = os.path.realpath(file)
    return None if file.startswith(_library_dirs()) else file


def _load_sources(sources: dict[str, str]) -> dict[str, str]:
    """Load each recorded module that is not loaded yet from its file; returns the module names to read
    differently (a foreign `__main__` is loaded under its file's name, as `rlhf run FILE` names it)."""
    renames: dict[str, str] = {}
    for name, file in sources.items():
        if name == "__main__":
            main_file = getattr(sys.modules.get("__main__"), "__file__", None)
            if isinstance(main_file, str) and os.path.realpath(main_file) == os.path.realpath(file):
                continue  # the process that built the graph (e.g. LocalRuntime building its workers)
            alias = os.path.splitext(os.path.basename(file))[0]
            loaded = sys.modules.get(alias)
            if loaded is None or os.path.realpath(getattr(loaded, "__file__", "") or "") != os.path.realpath(file):
                _load_file(alias, file)
            renames[name] = alias
        elif name not in sys.modules and os.path.isfile(file):
            _load_file(name, file)
    return renames


def _load_file(name: str, file: str) -> types.ModuleType:
    """Execute `file` as module `name` (registered in `sys.modules` first, as an import would be)."""
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


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
