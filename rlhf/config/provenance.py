"""Where every value of a graph came from, how two graphs differ, and running a stored graph again.

- `labelled(label)`: values set inside the block are recorded in fiddle's argument history
  with a label: `command line: set:PATH=VALUE`, `fiddler:tiny (experiments/x.py:80)`,
  `sweep:lr_sweep[1]`. `rlhf.config.overrides` applies `set:` and `fiddler:` inside one.
- `format_provenance(graph)`: the flattened graph (`rlhf show`, `--print_graph`), one line
  per value with where it was set: the experiment's file:line, a fiddler, a gin file:line,
  the command line, or `default` (the signature's).
- `diff_graphs(a, b)` / `format_diff`: the changed leaves of two graphs (`rlhf diff`), on
  `graph_io.flatten` (defaults materialized, so an explicit default is no change).
- `load_run_graph(repo, run)`: the stage graph an Aim run stored (`graph_json`);
  `rerun(run)` runs it again as a one-stage experiment (`rlhf rerun`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import inspect
import os
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import fiddle as fdl
from fiddle import history

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
    from rlhf.config.typecheck import parameter_hints

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
    from rlhf.config.typecheck import describe

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


# --------------------------------------------------------------------------- diff
@dataclasses.dataclass(frozen=True)
class Change:
    """One leaf that differs: `old`/`new` is `MISSING` where one graph lacks the path."""

    path: str
    old: Any
    new: Any


class _Missing:
    def __repr__(self) -> str:
        return "<absent>"


MISSING = _Missing()


def diff_graphs(a: Any, b: Any) -> list[Change]:
    """The leaves (of `graph_io.flatten`, defaults materialized) whose values differ, by path."""
    from rlhf.config.graph_io import flatten

    flat_a, flat_b = flatten(a), flatten(b)
    changes = []
    for path in sorted(set(flat_a) | set(flat_b)):
        old, new = flat_a.get(path, MISSING), flat_b.get(path, MISSING)
        if old is MISSING or new is MISSING or not _same(old, new):
            changes.append(Change(path, old, new))
    return changes


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b


def format_diff(changes: Sequence[Change], a_name: str = "A", b_name: str = "B") -> str:
    """`- path: old` / `+ path: new` lines, like a unified diff of the flattened graphs."""
    if not changes:
        return f"no differences between {a_name} and {b_name}"
    lines = [f"--- {a_name}", f"+++ {b_name}"]
    for c in changes:
        if c.new is MISSING:
            lines.append(f"- {c.path}: {c.old!r}")
        elif c.old is MISSING:
            lines.append(f"+ {c.path}: {c.new!r}")
        else:
            lines.append(f"~ {c.path}: {c.old!r} -> {c.new!r}")
    return "\n".join(lines)


# --------------------------------------------------------------------------- stored runs
def find_run(repo: str, run: str) -> dict[str, Any]:
    """The run of `repo` whose hash is `run` (or starts with it), as `query.find_runs` gives it."""
    from rlhf.tracking.query import find_runs

    if not os.path.isdir(repo):
        raise FileNotFoundError(f"no Aim repo at {repo!r} (pass --repo DIR, the folder holding .aim)")
    matches = [r for r in find_runs(repo) if r["hash"].startswith(run)]
    if not matches:
        raise LookupError(f"no run {run!r} in the Aim repo {repo!r} (list them with `aim runs ls --repo {repo}`)")
    if len(matches) > 1:
        raise LookupError(f"{run!r} is the start of {len(matches)} run hashes: {', '.join(r['hash'] for r in matches)}")
    (found,) = matches
    if not isinstance(found["params"].get("graph_json"), str):
        raise LookupError(f"run {found['hash']} stored no graph_json (was it started by rlhf, and closed?)")
    return found


def load_run_graph(repo: str, run: str) -> tuple[fdl.Buildable, dict[str, Any]]:
    """(the stage graph the run stored, the run) for a run hash or hash prefix."""
    from rlhf.config.graph_io import from_json

    found = find_run(repo, run)
    _importable_experiments()
    return from_json(found["params"]["graph_json"]), found


def _importable_experiments() -> None:
    """Callables defined in experiment files live in modules named after the file (`arithmetic_tiny`)."""
    for folder in (os.getcwd(), os.path.join(os.getcwd(), "experiments")):
        if os.path.isdir(folder) and folder not in sys.path:
            sys.path.append(folder)


def rerun_graph(
    repo: str, run: str, *, local: bool = False, output_dir: str = "outputs", commands: Sequence[str] = ()
) -> tuple[fdl.Config, dict[str, Any]]:
    """The one-stage Experiment that runs a stored run's stage graph again, and the run.

    The stored graph is the stage graph after `StageOutput`s were resolved (an RL stage stores
    the concrete SFT checkpoint path), so it runs on its own. The runtime is not stored with a
    run: `local=True` runs in-process (LocalRuntime), else on Ray. `commands` are `set:`
    overrides applied on top (e.g. `set:stages.grpo.total_steps=3`).
    """
    from rlhf.config.overrides import OverrideError, apply_set
    from rlhf.runtime.experiment import Experiment
    from rlhf.runtime.local import LocalRuntime
    from rlhf.runtime.ray_runtime import RayRuntime
    from rlhf.tracking.aim_tracker import AimTracker

    stage_graph, found = load_run_graph(repo, run)
    stage = found["params"].get("stage") or "stage"
    name = found["experiment"] or "rerun"
    with labelled(f"rerun of {found['hash']}", with_caller=False):
        root = fdl.Config(
            Experiment,
            name=name,
            stages={stage: stage_graph},
            runtime=fdl.Config(LocalRuntime if local else RayRuntime),
            tracker=fdl.Config(AimTracker, repo=repo, experiment=name),
            output_dir=output_dir,
        )
    for command in commands:
        if not command.startswith("set:"):
            raise OverrideError(f"rerun takes set:PATH=VALUE overrides only, got {command!r}")
        apply_set(root, command.removeprefix("set:"))
    return root, found


def rerun(
    run: str, repo: str = ".aim", *, local: bool = False, output_dir: str = "outputs", commands: Sequence[str] = ()
) -> dict[str, dict[str, Any]]:
    """Run a stored run's stage graph again; the new Aim run records `rerun_of` = the old hash."""
    from rlhf.runtime.experiment import run_experiment

    root, found = rerun_graph(repo, run, local=local, output_dir=output_dir, commands=commands)
    return run_experiment(
        root, overrides=[f"rerun:{found['hash']}", *commands], run_params={"rerun_of": found["hash"]}
    )
