"""Apply command-line overrides to a fiddle graph: `config:`, `fiddler:` and `set:`, in order.

The grammar is fiddle's (`--config config:base(model="x")`, `--config fiddler:tiny`,
`--config set:stages.grpo.total_steps=20`), with three differences that save users time:
a command line without `config:` starts from the module's `base()`; every misspelled
name (fiddler, field, stage) fails at once with the valid names and a "did you mean"; and
a `config:` that is not the first command is refused, since it builds the graph afresh and
would silently drop the commands before it.
"""

from __future__ import annotations

import ast
import difflib
import inspect
import shlex
import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import fiddle as fdl

from rlhf.config.provenance import labelled


__all__ = [
    "OverrideError",
    "apply_commands",
    "apply_overrides",
    "apply_set",
    "did_you_mean",
    "is_set",
    "named_functions",
    "parse_call",
    "parse_path",
    "set_path",
]


class OverrideError(ValueError):
    """A command-line override names something that does not exist, or is malformed."""


def did_you_mean(name: str, options: Iterable[str]) -> str:
    """` Did you mean 'x'? Valid names: a, b.`: the end of an error message about a misspelled `name`."""
    options = sorted(set(options))
    close = difflib.get_close_matches(name, options, n=1, cutoff=0.5)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return f"{hint} Valid names: {', '.join(options) or '(none)'}."


def parse_call(text: str, kind: str) -> tuple[str, dict[str, Any]]:
    """`name` or `name(k=v, ...)` with literal values -> (name, kwargs)."""
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as err:
        raise OverrideError(f"{kind}:{text} is not `name` or `name(arg=value, ...)`: {err.msg}") from None
    if isinstance(node, ast.Name):
        return node.id, {}
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.args:
        names = [kw.arg for kw in node.keywords]
        twice = sorted({n for n in names if names.count(n) > 1 and n is not None})
        if twice:  # Python refuses `f(a=1, a=2)`; a dict of the keywords would silently keep the last one
            raise OverrideError(f"{kind}:{text}: argument {', '.join(map(repr, twice))} given more than once; "
                                "give each once")
        try:
            return node.func.id, {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords}
        except ValueError:
            raise OverrideError(
                f"{kind}:{text}: argument values must be Python literals (quote strings: x='abc')"
            ) from None
    raise OverrideError(f"{kind}:{text} is not `name` or `name(arg=value, ...)` with keyword arguments only")


def parse_path(text: str) -> list[str | int]:
    """`stages.grpo.total_steps` or `stages["grpo"].items[0]` -> ["stages", "grpo", "total_steps"]."""
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        raise OverrideError(f"set:{text}: {text!r} is not a path like stages.grpo.total_steps") from None
    out: list[str | int] = []
    while True:
        if isinstance(node, ast.Attribute):
            out.append(node.attr)
            node = node.value
        elif isinstance(node, ast.Subscript):
            out.append(ast.literal_eval(node.slice))
            node = node.value
        elif isinstance(node, ast.Name):
            out.append(node.id)
            return out[::-1]
        else:
            raise OverrideError(f"set:{text}: {text!r} is not a path like stages.grpo.total_steps")


def _fields(node: fdl.Buildable) -> list[str]:
    sig = inspect.signature(fdl.get_callable(node))
    return [p.name for p in sig.parameters.values() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def _accepts_any_kwarg(node: fdl.Buildable) -> bool:
    sig = inspect.signature(fdl.get_callable(node))
    return any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values())


def _child(value: Any, key: str | int, where: str) -> Any:
    if isinstance(value, fdl.Buildable):
        if not isinstance(key, str) or (key not in _fields(value) and not _accepts_any_kwarg(value)):
            raise OverrideError(
                f"{fdl.get_callable(value).__name__} at {where or '<root>'} has no field {key!r}."
                + did_you_mean(str(key), _fields(value))
            )
        return getattr(value, key)
    if isinstance(value, dict):
        if key not in value:
            raise OverrideError(f"{where or '<root>'} has no key {key!r}." + did_you_mean(str(key), map(str, value)))
        return value[key]
    if isinstance(value, (list, tuple)) and isinstance(key, int):
        if not -len(value) <= key < len(value):
            raise OverrideError(f"{where} has {len(value)} items; index {key} is out of range")
        return value[key]
    raise OverrideError(f"{where or '<root>'} is a {type(value).__name__}, which has no field {key!r}")


def set_path(graph: Any, path: str, value: Any) -> None:
    """Set the field at dotted `path` of `graph` to `value` (checked against the signature)."""
    keys = parse_path(path)
    node, where = graph, ""
    for key in keys[:-1]:
        node = _child(node, key, where)
        where = f"{where}.{key}" if where else str(key)
    last = keys[-1]
    if isinstance(node, fdl.Buildable):
        _child(node, last, where)  # validates the field name
        setattr(node, last, value)
    elif isinstance(node, (dict, list)):
        if isinstance(node, dict):
            _child(node, last, where)
        node[last] = value
    else:
        raise OverrideError(f"cannot set {path}: {where} is a {type(node).__name__}")


def apply_set(graph: Any, body: str) -> None:
    """Apply `PATH=VALUE` (the text after `set:`); the value is recorded as "command line: set:..."."""
    path, eq, raw = body.partition("=")
    if not eq:
        raise OverrideError(f"set:{body} needs `=`: set:path.to.field=value")
    try:
        value = ast.literal_eval(raw.strip())
    except (ValueError, SyntaxError):
        raise OverrideError(
            f"set:{body}: the value {raw!r} is not a Python literal; quote strings, e.g. set:{path}='{raw}'"
        ) from None
    with labelled(f"command line: set:{body.strip()}", with_caller=False):
        set_path(graph, path.strip(), value)


def named_functions(namespaces: Sequence[types.ModuleType]) -> dict[str, Callable]:
    """The public functions defined in `namespaces` by name (configs, fiddlers, sweeps); earlier ones win."""
    out: dict[str, Callable] = {}
    for module in reversed(namespaces):  # earlier namespaces win
        for name, obj in vars(module).items():  # functions defined there, not imported ones
            if inspect.isfunction(obj) and not name.startswith("_") and obj.__module__ == module.__name__:
                out[name] = obj
    return out


def apply_overrides(
    commands: Sequence[str], namespaces: Sequence[types.ModuleType], default_config: str = "base"
) -> tuple[Any, list[str]]:
    """Build the graph from `commands`; returns (graph, the fiddlers applied by name)."""
    functions = named_functions(namespaces)
    commands = list(commands)
    late = [i for i, command in enumerate(commands) if command.startswith("config:") and i > 0]
    if late:
        first = commands[late[0]]
        dropped = ", ".join(repr(c) for c in commands[: late[0]])
        rest = [c for i, c in enumerate(commands) if i != late[0]]
        order = " ".join(f"--config {shlex.quote(c)}" for c in [first, *rest])
        raise OverrideError(
            f"{first!r} builds the graph from scratch, so the commands before it ({dropped}) would be dropped. "
            f"Give one config: and put it first: {order}"
        )
    if not commands or not commands[0].startswith(("config:",)):
        commands.insert(0, f"config:{default_config}")
    name, kwargs = parse_call(commands[0].partition(":")[2], "config")
    if name not in functions:
        raise OverrideError(f"no config function {name!r}." + did_you_mean(name, functions))
    return apply_commands(functions[name](**kwargs), commands[1:], functions)


def apply_commands(graph: Any, commands: Sequence[str], functions: Mapping[str, Callable]) -> tuple[Any, list[str]]:
    """Apply `fiddler:` and `set:` commands, in order, to a graph already built; `functions` holds the
    fiddlers by name (`named_functions`). Returns (graph, the fiddlers applied by name)."""
    fiddlers = []
    for command in commands:
        kind, _, body = command.partition(":")
        if kind == "fiddler":
            name, kwargs = parse_call(body, kind)
            if name not in functions:
                raise OverrideError(f"no fiddler {name!r}." + did_you_mean(name, functions))
            with labelled(f"fiddler:{body}"):  # argument history: "fiddler:tiny (file:line)"
                result = functions[name](graph, **kwargs)
            graph = result if result is not None else graph
            fiddlers.append(body)
        elif kind == "set":
            apply_set(graph, body)
        else:
            raise OverrideError(
                f"unknown override {command!r}: use config:NAME(...), fiddler:NAME(...) or set:PATH=VALUE"
            )
    return graph, fiddlers


def is_set(graph: Any, path: str) -> bool:
    """Whether the graph sets a value at `path` (every node on the way exists and the last one's argument is
    given explicitly, not left to its default): for overrides that apply only where a graph has the field."""
    keys = parse_path(path)
    node, where = graph, ""
    try:
        for key in keys[:-1]:
            node = _child(node, key, where)
            where = f"{where}.{key}" if where else str(key)
    except OverrideError:
        return False
    if isinstance(node, fdl.Buildable):
        return keys[-1] in node.__arguments__
    return isinstance(node, dict) and keys[-1] in node
