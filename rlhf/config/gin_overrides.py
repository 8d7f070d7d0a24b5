"""Gin files as overrides of a fiddle graph: `RLTrainer.total_steps = 2` sets that argument on
every `RLTrainer` node of the graph.

The text is parsed by gin's own parser (`gin.config_parser`); nothing is registered with
gin, and no gin configurable is ever called. Each statement maps onto the graph:

- `Selector.param = value` sets `param` on every node (`fdl.Config` or `fdl.Partial`) whose
  callable the selector names. Short names (`AdamW`, `optim.AdamW`) match by name: the last
  part is the callable's `__name__`, any parts before it must be consecutive parts of its
  module path (`torch.optim.adamw`). They must match at least one node. A selector that
  resolves to an object (an importable dotted path such as `rlhf.trainers.sft.SFTTrainer`,
  or a name bound by an `import` in the file) matches that very object and may match no
  node: it cannot be a typo, so a shared file can set SFT and RL stages alike.
- `scope/Selector.param = value` limits the binding to nodes under `scope`. A scope matches
  a node when, on some path from the root to the node (the node included), an attribute
  name or dict key equals it, or a node's `name` argument equals it (`policy` is the name
  of the policy `Remote`). `a/b/X.p` needs `a` and `b` in that order along one path.
- Values: Python literals, lists/tuples/dicts of values, `%MACRO` (defined in the files as
  `MACRO = value`, anywhere; the last definition wins), `@Name()` (a new `fdl.Config` of
  Name) and `@Name` (an `fdl.Partial`). Name is a callable already in the graph, a name
  bound by an `import`, or an importable dotted path (`@rlhf.algos.RLOO()`).
- `include 'other.gin'` reads another file: next to the including file, else relative to
  the current directory, else among the shipped files (`rlhf_configs/`).
- `import x.y` / `from x import y as z` import modules (or objects) for dotted names.

Bindings apply in file order, and the last binding of an argument wins. A node that `@X()`
creates also receives every earlier binding that selects it, so, as in gin, line order
only matters between bindings of the same argument. Every value set is recorded in fiddle's
argument history at `file.gin:LINE`.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import importlib
import inspect
import io
import tokenize
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import fiddle as fdl
from fiddle import daglish, history
from gin import config_parser

from rlhf.config.overrides import OverrideError

SHIPPED = Path(__file__).resolve().parents[2] / "rlhf_configs"  # the *.gin files shipped with rlhf
_UNSET = object()  # an argument that was not set before a binding set it
_MAX_ROUNDS = 50  # bound on nodes created by earlier bindings for nodes created by later ones


class GinError(OverrideError):
    """A gin file is malformed or names something that is not in the graph."""


@dataclasses.dataclass(frozen=True)
class _Ref:
    name: str
    evaluate: bool  # @X() -> fdl.Config, @X -> fdl.Partial


@dataclasses.dataclass(frozen=True)
class _Macro:
    name: str


class _Delegate(config_parser.ParserDelegate):
    """Keeps references and macros as placeholders; they are resolved against the graph later."""

    def configurable_reference(self, scoped_configurable_name: str, evaluate: bool) -> _Ref:
        return _Ref(scoped_configurable_name, evaluate)

    def macro(self, macro_name: str) -> _Macro:
        return _Macro(macro_name)


@dataclasses.dataclass
class _Binding:
    scope: tuple[str, ...]
    selector: str
    param: str
    value: Any
    file: str
    line: int
    target: Any = None  # the object an importable selector names; None: match by name
    matched: int = 0

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"

    @property
    def text(self) -> str:
        scope = "".join(f"{s}/" for s in self.scope)
        return f"{scope}{self.selector}.{self.param}"


@dataclasses.dataclass
class _Node:
    node: fdl.Buildable
    paths: list[str]  # readable paths from the root, e.g. .stages['grpo'].sampling
    places: list[list[set[str]]]  # per path, per depth: the names a scope can match there

    @property
    def fn(self) -> Any:
        return fdl.get_callable(self.node)


def _short_name(fn: Any) -> str:
    return getattr(fn, "__name__", None) or type(fn).__name__


def _full_name(fn: Any) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', _short_name(fn))}"


def _name_matches(selector: str, fn: Any) -> bool:
    """`AdamW`, `optim.AdamW`, `torch.optim.AdamW` all match torch.optim.adamw.AdamW."""
    parts = selector.split(".")
    if parts[-1] != _short_name(fn):
        return False
    want = parts[:-1]
    if not want:
        return True
    qualname = getattr(fn, "__qualname__", _short_name(fn)).split(".")[:-1]
    have = (getattr(fn, "__module__", None) or "").split(".") + qualname
    return any(have[i : i + len(want)] == want for i in range(len(have) - len(want) + 1))


def _scope_matches(scope: tuple[str, ...], places: list[set[str]]) -> bool:
    """Each scope name in order at a depth no shallower than the previous one's."""
    i = 0
    for names in places:
        while i < len(scope) and scope[i] in names:
            i += 1
    return i == len(scope)


def _parameters(fn: Any) -> tuple[list[str], bool] | None:
    """(argument names, accepts **kwargs), or None where the signature cannot be read."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    names = [p.name for p in sig.parameters.values() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    return names, any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values())


def _suggest(name: str, options: Iterable[str], label: str) -> str:
    options = sorted(set(options))
    close = difflib.get_close_matches(name, options, n=1, cutoff=0.5)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return f"{hint} {label}: {', '.join(options) or '(none)'}."


def _node_name(value: Any) -> str | None:
    if isinstance(value, fdl.Buildable) and "name" in value.__arguments__:
        name = value.__arguments__["name"]
        return name if isinstance(name, str) else None
    return None


def _index(graph: Any) -> list[_Node]:
    """Every Buildable of the graph once (shared nodes too), with all paths to it."""
    paths_by_id = daglish.collect_paths_by_id(graph, memoizable_only=True)
    nodes = []
    for value, _ in daglish.iterate(graph):
        if not isinstance(value, fdl.Buildable):
            continue
        paths = paths_by_id[id(value)]
        places = []
        for path in paths:
            current, depth_names = graph, [{n for n in [_node_name(graph)] if n}]
            for element in path:
                current = element.follow(current)
                names = {n for n in [_node_name(current)] if n}
                if isinstance(element, daglish.Attr):
                    names.add(element.name)
                elif isinstance(element, daglish.Key) and isinstance(element.key, str):
                    names.add(element.key)
                depth_names.append(names)
            places.append(depth_names)
        nodes.append(_Node(value, [daglish.path_str(p) or "<root>" for p in paths], places))
    return nodes


def _callables(graph: Any, index: list[_Node]) -> list[Any]:
    """The callables of the graph: those of its nodes and plain functions/classes held as values."""
    found: dict[int, Any] = {id(n.fn): n.fn for n in index}
    for value, _ in daglish.iterate(graph):
        children = value.__arguments__.values() if isinstance(value, fdl.Buildable) else (
            value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else ()
        )
        for child in children:
            if inspect.isfunction(child) or inspect.isclass(child):
                found[id(child)] = child
    return list(found.values())


def _buildables(value: Any) -> list[fdl.Buildable]:
    return [v for v, _ in daglish.iterate(value) if isinstance(v, fdl.Buildable)]


class _Gin:
    """One application of gin files to one graph."""

    def __init__(self, graph: Any):
        self.graph = graph
        self.bindings: list[_Binding] = []
        self.macros: dict[str, tuple[Any, str]] = {}  # name -> (value, where defined)
        self.imports: dict[str, Any] = {}  # names bound by import statements
        self.created_by: dict[int, int] = {}  # id(node made by @X()) -> index of its binding
        self.undo: list[tuple[fdl.Buildable, str, Any, list]] = []  # (node, param, old value, old history)

    # ------------------------------------------------------------------ reading
    def read(self, name: str, text: str, including: tuple[str, ...] = ()) -> None:
        stream = io.StringIO(text)
        stream.name = name
        try:
            for statement in config_parser.ConfigParser(stream, _Delegate()):
                self._statement(statement, name, including)
        except SyntaxError as err:
            line = (err.text or "").strip()
            shown = f"\n    {line}" if line else ""
            raise GinError(f"{err.filename or name}:{err.lineno}: {err.msg}{shown}") from None
        except tokenize.TokenError as err:
            raise GinError(f"{name}: {err.args[0]} (an unclosed bracket or string?)") from None

    def _statement(self, statement: Any, name: str, including: tuple[str, ...]) -> None:
        file, line = statement.location.filename or name, statement.location.line_num
        where = f"{file}:{line}"
        if isinstance(statement, config_parser.BindingStatement):
            if not statement.arg_name:  # MACRO = value
                macro = f"{statement.scope}/{statement.selector}" if statement.scope else statement.selector
                self.macros[macro] = (statement.value, where)
                return
            scope = tuple(statement.scope.split("/")) if statement.scope else ()
            binding = _Binding(scope, statement.selector, statement.arg_name, statement.value, file, line)
            binding.target = self._resolve(binding.selector, where)
            if binding.target is not None:
                if not callable(binding.target):
                    raise GinError(f"{where}: {binding.text}: {binding.selector} is {binding.target!r}, not a callable")
                self._check_param(binding, binding.target)
            self.bindings.append(binding)
        elif isinstance(statement, config_parser.ImportStatement):
            self.imports[statement.bound_name()] = self._import(statement, where)
        elif isinstance(statement, config_parser.IncludeStatement):
            path = _include_path(statement.filename, name)
            if path is None:
                raise GinError(f"{where}: include {statement.filename!r}: no such file next to {name}, in the "
                               f"current directory, or in {SHIPPED}")
            chain = (*including, name)
            if path.resolve() in {Path(f).resolve() for f in chain}:
                raise GinError(f"{where}: include {statement.filename!r} includes itself (through "
                               f"{' -> '.join(chain)})")
            self.read(str(path), path.read_text(), chain)
        # BlockDeclaration (`X:` followed by indented `param = value` lines): its bindings follow it.

    def _import(self, statement: config_parser.ImportStatement, where: str) -> Any:
        try:
            module = importlib.import_module(statement.module)
            if not statement.is_from and not statement.alias:
                return importlib.import_module(statement.module.split(".")[0])
            return module
        except ModuleNotFoundError as err:
            if statement.is_from and err.name == statement.module:  # from module import attribute
                parent, _, attr = statement.module.rpartition(".")
                if hasattr(importlib.import_module(parent), attr):
                    return getattr(importlib.import_module(parent), attr)
            raise GinError(f"{where}: {statement.format()} failed: {err}") from None

    def _resolve(self, dotted: str, where: str) -> Any:
        """The object a dotted name (or an imported name) refers to, or None if it names none."""
        parts = dotted.split(".")
        if parts[0] in self.imports:
            obj = self.imports[parts[0]]
            for i, part in enumerate(parts[1:], start=1):
                if not hasattr(obj, part):
                    raise GinError(f"{where}: {'.'.join(parts[:i])} has no attribute {part!r}")
                obj = getattr(obj, part)
            return obj
        for i in range(len(parts) - 1, 0, -1):
            module_name = ".".join(parts[:i])
            try:
                obj = importlib.import_module(module_name)
            except ModuleNotFoundError as err:
                if err.name and (module_name + ".").startswith(err.name + "."):
                    continue  # that module does not exist: try a shorter one, or match by name
                raise GinError(f"{where}: importing {module_name} for {dotted!r} failed: {err}") from None
            for part in parts[i:]:
                if not hasattr(obj, part):
                    return None
                obj = getattr(obj, part)
            return obj
        return None

    # ---------------------------------------------------------------- applying
    def apply(self) -> None:
        """Apply every binding; on any error the graph is left as it was."""
        try:
            self._apply_all()
        except Exception:
            self._rollback()
            raise

    def _rollback(self) -> None:
        with history.suspend_tracking():
            for node, param, old, old_history in reversed(self.undo):
                if old is _UNSET:
                    delattr(node, param)
                else:
                    setattr(node, param, old)
                if old_history:
                    node.__argument_history__[param] = old_history
                else:
                    node.__argument_history__.pop(param, None)

    def _apply_all(self) -> None:
        for j, binding in enumerate(self.bindings):
            created = self._apply(j, [n for n in _index(self.graph) if self._selects(binding, n)])
            self._catch_up(created, j)
        for binding in self.bindings:
            if not binding.matched and binding.target is None:
                raise GinError(self._no_match(binding))
            if not binding.matched:  # an import-path selector absent from this graph: still check the value
                self._value(binding.value, binding.where, ())

    def _catch_up(self, created: set[int], upto: int) -> None:
        """Nodes made by @X() get the bindings up to `upto` that select them (gin is order-free)."""
        for _ in range(_MAX_ROUNDS):
            if not created:
                return
            fresh = [n for n in _index(self.graph) if id(n.node) in created]
            created = set()
            for i, binding in enumerate(self.bindings[: upto + 1]):
                targets = [n for n in fresh if self.created_by.get(id(n.node)) != i and self._selects(binding, n)]
                created |= self._apply(i, targets)
        raise GinError(f"{self.bindings[upto].where}: @references create nodes that create each other endlessly")

    def _selects(self, binding: _Binding, node: _Node) -> bool:
        if binding.target is not None:
            if node.fn is not binding.target:
                return False
        elif not _name_matches(binding.selector, node.fn):
            return False
        return not binding.scope or any(_scope_matches(binding.scope, places) for places in node.places)

    def _apply(self, i: int, targets: list[_Node]) -> set[int]:
        """Set binding i on `targets`; returns the ids of the nodes its values created."""
        binding = self.bindings[i]
        created: set[int] = set()
        if not targets:
            return created
        value = self._value(binding.value, binding.where, ())
        location = history.Location(binding.file, binding.line, None)  # shown as file.gin:LINE
        for target in targets:
            self._check_param(binding, target.fn)
            new = copy.deepcopy(value)
            old = target.node.__arguments__.get(binding.param, _UNSET)
            old_history = list(target.node.__argument_history__.get(binding.param, []))
            self.undo.append((target.node, binding.param, old, old_history))
            with history.custom_location(lambda: location):
                setattr(target.node, binding.param, new)
            for node in _buildables(new):
                self.created_by[id(node)] = i
                created.add(id(node))
        binding.matched += len(targets)
        return created

    def _check_param(self, binding: _Binding, fn: Any) -> None:
        params = _parameters(fn)
        if params is None:
            return
        names, any_kwarg = params
        if binding.param not in names and not any_kwarg:
            raise GinError(
                f"{binding.where}: {binding.text}: {_short_name(fn)} ({_full_name(fn)}) has no parameter "
                f"{binding.param!r}." + _suggest(binding.param, names, "Valid parameters")
            )

    def _value(self, value: Any, where: str, macros: tuple[str, ...]) -> Any:
        if isinstance(value, _Macro):
            if value.name in macros:
                raise GinError(f"{where}: macro %{value.name} refers to itself ({' -> '.join([*macros, value.name])})")
            if value.name not in self.macros:
                raise GinError(f"{where}: macro %{value.name} is not defined (define it as `{value.name} = ...`)."
                               + _suggest(value.name, self.macros, "Defined macros"))
            raw, defined = self.macros[value.name]
            return self._value(raw, defined, (*macros, value.name))
        if isinstance(value, _Ref):
            fn = self._callable(value.name, where)
            return fdl.Config(fn) if value.evaluate else fdl.Partial(fn)
        if isinstance(value, dict):
            return {self._value(k, where, macros): self._value(v, where, macros) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(self._value(v, where, macros) for v in value)
        return value

    def _callable(self, name: str, where: str) -> Any:
        if "/" in name:
            raise GinError(f"{where}: scoped references (@{name}) are not supported; set arguments of the new "
                           "node with scoped bindings instead")
        fn = self._resolve(name, where)
        if fn is not None:
            if not callable(fn):
                raise GinError(f"{where}: @{name} is {fn!r}, which is not callable")
            return fn
        index = _index(self.graph)
        known = _callables(self.graph, index)
        found = {id(f): f for f in known if _name_matches(name, f)}
        if len(found) == 1:
            return next(iter(found.values()))
        if found:
            raise GinError(f"{where}: @{name} is ambiguous in this graph: "
                           f"{', '.join(sorted(_full_name(f) for f in found.values()))}. Use a dotted path.")
        raise GinError(
            f"{where}: @{name} is neither a callable in the graph nor an importable dotted path "
            "(e.g. @rlhf.algos.RLOO())." + _suggest(name, (_short_name(f) for f in known), "Callables in the graph")
        )

    def _no_match(self, binding: _Binding) -> str:
        index = _index(self.graph)
        by_name = [n for n in index if _name_matches(binding.selector, n.fn)]
        if by_name:
            paths = sorted(p for n in by_name for p in n.paths)
            return (
                f"{binding.where}: {binding.text}: no {binding.selector} node is under scope "
                f"{'/'.join(binding.scope)!r}. The {binding.selector} nodes are at {', '.join(paths)}; a scope "
                "matches an attribute name, a dict key, or a `name` argument on the path to the node."
            )
        names = {_short_name(n.fn) for n in index}
        return (
            f"{binding.where}: {binding.text}: no node in the graph calls {binding.selector!r}."
            + _suggest(binding.selector.rsplit(".", 1)[-1], names, "Callables in the graph")
            + " (A component that may be absent from a graph can be named by its import path, "
            "e.g. rlhf.trainers.sft.SFTTrainer.total_steps.)"
        )


def _include_path(filename: str, including: str) -> Path | None:
    candidates = [Path(filename)] if Path(filename).is_absolute() else [
        Path(including).parent / filename, Path(filename), SHIPPED / filename]
    return next((p for p in candidates if p.is_file()), None)


def _find(path: str) -> Path:
    candidates = [Path(path)] if Path(path).is_absolute() else [Path(path), SHIPPED / path]
    found = next((p for p in candidates if p.is_file()), None)
    if found is None:
        shipped = sorted(p.name for p in SHIPPED.glob("*.gin"))
        raise GinError(f"gin file {path!r} not found (also looked in {SHIPPED})."
                       + _suggest(Path(path).name, shipped, "Shipped gin files"))
    return found


def apply_gin(graph: Any, path: str | None = None, text: str | None = None) -> Any:
    """Apply the gin bindings in `path` (or in `text`) to `graph`; mutates and returns it.

    `path` is read unless `text` is given; with both, `text` is the content and `path` names
    it (in messages, history, and for relative includes). A relative `path` that does not
    exist is also looked up among the shipped files in `rlhf_configs/`.
    """
    if path is None and text is None:
        raise GinError("apply_gin needs a gin file path or gin text")
    if text is None:
        found = _find(path)
        name, text = str(found), found.read_text()
    else:
        name = path or "<gin text>"
    gin = _Gin(graph)
    gin.read(name, text)
    gin.apply()
    return graph
