"""Where every value of a graph came from: fiddle's argument history, labelled and printed.

- `labelled(label)`: values set inside the block are recorded in fiddle's argument history
  with a label: `command line: set:PATH=VALUE`, `fiddler:tiny (experiments/x.py:80)`,
  `sweep:lr_sweep[1]`. `rlhf.config.overrides` applies `set:` and `fiddler:` inside one.
- `format_provenance(graph)`: the flattened graph (`rlhf show`, `--print_graph`), one line
  per value with where it was set: the experiment's file:line, a fiddler, a gin file:line,
  the command line, or `default` (the signature's).

How two graphs differ is `rlhf.graph.diff`; running a stored run's graph again is `rlhf.cli.rerun`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import inspect
import os
from collections.abc import Iterator
from typing import Any

import fiddle as fdl
from fiddle import history

from rlhf.typefit import describe, parameter_hints

_FIDDLE_DIR = os.path.dirname(fdl.__file__)
_THIS_DIR = os.path.dirname(os.path.abspath(__file__))
_SKIP_FILES = (os.path.join(_THIS_DIR, "overrides.py"), os.path.abspath(__file__))
DEFAULT = "default"


# --------------------------------------------------------------------------- labels
@dataclasses.dataclass(frozen=True)
class LabeledLocation(history.Location):
    """A history location that says what set the value: `label (file:line)`, or just `label`."""

    label: str = ""

    def format(self, max_filename_parts: int | None = None) -> str:
        if not self.filename:
            return self.label
        return f"{self.label} ({_short_path(self.filename)}:{self.line_number})"

    def __str__(self) -> str:
        return self.format()


def _caller_location() -> history.Location:
    """The innermost frame outside fiddle and this package's override machinery."""
    frame = inspect.currentframe()
    while frame is not None:
        filename = frame.f_code.co_filename
        if not (filename.startswith(_FIDDLE_DIR) or filename in _SKIP_FILES or "contextlib" in filename):
            return history.Location(filename, frame.f_lineno, frame.f_code.co_name)
        frame = frame.f_back
    return history.Location("", 0, None)


@contextlib.contextmanager
def labelled(label: str, *, with_caller: bool = True) -> Iterator[None]:
    """Record values set in this block with `label` (plus the file:line that set them, unless
    `with_caller=False`). A gin file applied inside the block labels its own values `file.gin:LINE`."""

    def location() -> history.Location:
        if not with_caller:
            return LabeledLocation("", 0, None, label)
        where = _caller_location()
        return LabeledLocation(where.filename, where.line_number, where.function_name, label)

    with history.custom_location(location):
        yield


# --------------------------------------------------------------------------- show
def format_provenance(graph: Any) -> str:
    """The graph, one `path: type = value   # where` line per value (a node gets a line too).

    `where` is the latest entry of the argument's fiddle history: `experiments/x.py:42` (the
    function that built or changed it), `fiddler:NAME (file:line)`, `rlhf_configs/debug.gin:3`,
    `command line: set:...`, `sweep:NAME[i]`; `default` for an argument left at its signature
    default. A node reached by several paths is listed once, then named at its other paths.
    """
    rows: list[tuple[str, str]] = []
    seen: dict[int, str] = {}

    def visit(value: Any, path: str, where: str, annotation: str = "") -> None:
        if isinstance(value, fdl.Buildable):
            if id(value) in seen:
                rows.append((f"{path}{annotation} = <the node at {seen[id(value)]}>", where))
                return
            seen[id(value)] = path or "<root>"
            if path:
                rows.append((f"{path}{annotation} = {_node_name(value)}", where))
            for name, arg_where, arg, arg_annotation in _arguments(value):
                visit(arg, _join(path, name), arg_where, arg_annotation)
        elif isinstance(value, dict) and value and _nested(value):
            for key, item in value.items():
                visit(item, f"{path}[{key!r}]", where)
        elif isinstance(value, (list, tuple)) and value and _nested(value):
            for i, item in enumerate(value):
                visit(item, f"{path}[{i}]", where)
        else:
            rows.append((f"{path}{annotation} = {_value_str(value)}", where))

    visit(graph, "", "")
    width = min(max((len(left) for left, _ in rows), default=0), 90)
    return "\n".join(f"{left.ljust(width)}  # {where}" if where else left for left, where in rows)


def _nested(container: Any) -> bool:
    """Whether a container holds more than plain values (then each item gets its own line)."""
    items = container.values() if isinstance(container, dict) else container
    return not all(isinstance(v, (bool, int, float, str, type(None))) for v in items)


def _arguments(node: fdl.Buildable) -> Iterator[tuple[str, str, Any, str]]:
    """(name, where, value, ": annotation") per argument: signature order, then extra kwargs."""
    signature = node.__signature_info__.signature
    arguments = node.__arguments__
    hints = parameter_hints(fdl.get_callable(node))
    names = [n for n, p in signature.parameters.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    names += [n for n in arguments if n not in names]
    for name in names:
        param = signature.parameters.get(name)
        annotation = _annotation(param, hints.get(name))
        if name in arguments:
            yield str(name), _where(node, name), arguments[name], annotation
        elif param is not None and param.default is not param.empty:
            yield str(name), DEFAULT, param.default, annotation
        elif isinstance(node, fdl.Config):
            yield str(name), "REQUIRED: not set", _Unset(), annotation
        else:
            yield str(name), "supplied when the partial is called", _Unset(), annotation


class _Unset:
    def __repr__(self) -> str:
        return "<[unset]>"


def _where(node: fdl.Buildable, name: str) -> str:
    entries = [e for e in node.__argument_history__.get(name, []) if e.kind == history.ChangeKind.NEW_VALUE]
    if not entries:
        return "?"
    location = entries[-1].location
    if isinstance(location, LabeledLocation):
        return location.format()
    if not location.filename:
        return "?"
    text = f"{_short_path(location.filename)}:{location.line_number}"
    return f"{text} ({location.function_name})" if location.function_name not in (None, "<module>") else text


def _annotation(param: inspect.Parameter | None, resolved: Any = None) -> str:
    """`: int > 0` (the type with its range markers, `rlhf.ranges`), or the annotation's text."""
    if param is None or param.annotation is param.empty:
        return ""
    ann = param.annotation
    if resolved is not None:
        text = describe(resolved)
    else:
        text = ann if isinstance(ann, str) else getattr(ann, "__qualname__", None) if isinstance(ann, type) else str(ann)
    return f": {text}" if text and len(text) <= 40 else ""


def _node_name(node: fdl.Buildable) -> str:
    return f"{type(node).__name__}({_qualname(fdl.get_callable(node))})"


def _value_str(value: Any) -> str:
    if isinstance(value, enum.Enum):
        return f"{type(value).__name__}.{value.name}"
    if isinstance(value, type) or (callable(value) and hasattr(value, "__qualname__")):
        return _qualname(value)
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def _qualname(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', getattr(obj, '__name__', repr(obj)))}"


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _short_path(filename: str) -> str:
    """`filename` relative to the working directory when it is below it."""
    try:
        rel = os.path.relpath(filename)
    except ValueError:
        return filename
    return rel if not rel.startswith("..") else filename
