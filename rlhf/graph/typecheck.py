"""Every configured value against its parameter's annotation, before anything is built.

One mechanism for the whole graph: for each node, the callable's signature gives each
parameter's type (`typing.get_type_hints`, `Annotated` kept) and the range markers of
`rlhf.ranges` (`Annotated[int, Positive]`, `Interval(gt=0, le=1)`, any `annotated_types`
marker). `annotation_problems(nodes)` returns one line per explicitly set value that does
not fit, naming its path, its value and what was expected:

    stages.grpo.total_steps = 'ten': RLTrainer.total_steps expects int > 0

No component has per-field checking code here. What cannot be judged passes: sub-graphs
(their built type is known only after building), unresolvable forward references, protocols
that are not runtime-checkable, TypeVars. Numbers follow PEP 484's numeric tower (an int fits
`float`) but a bool is never taken for a number; a list fits a `tuple[...]` (command-line
literals) when its items fit; a `str` fits a `Path`.

Third-party callables cannot carry our markers; `external_ranges()` adds them for the few
arguments every experiment sets (a torch optimizer's `lr`).
"""

from __future__ import annotations

import collections.abc
import dataclasses
import functools
import inspect
import os
import pathlib
import sys
import types
import typing
from collections.abc import Iterable
from typing import Annotated, Any, Literal, Union

import annotated_types as at
import fiddle as fdl

__all__ = ["annotation_problems", "violation", "describe", "external_ranges"]


def external_ranges() -> list[tuple[type, dict[str, Any]]]:
    """(base class, {parameter: extra annotation}) for callables outside this project."""
    torch = sys.modules.get("torch")  # a graph can hold torch callables only if torch is imported
    if torch is None:
        return []
    return [(torch.optim.Optimizer, {"lr": Annotated[float, at.Ge(0)], "weight_decay": Annotated[float, at.Ge(0)],
                                     "eps": Annotated[float, at.Ge(0)]})]



def annotation_problems(nodes: Iterable[tuple[fdl.Buildable, str]]) -> list[str]:
    """One `path = value: Owner.param expects TYPE` line per set value that does not fit."""
    problems: list[str] = []
    external = external_ranges()
    for node, path in nodes:
        fn = fdl.get_callable(node)
        hints = parameter_hints(fn)
        extra = {}
        for base, params in external:
            if isinstance(fn, type) and issubclass(fn, base):
                extra = params
        for name, value in node.__arguments__.items():
            if not isinstance(name, str):
                continue  # *args
            where = f"{path}.{name}" if path else name
            for annotation in (hints.get(name), extra.get(name)):
                if annotation is None:
                    continue
                expected = violation(value, annotation)
                if expected is not None:
                    problems.append(f"{where} = {_short(value)}: {_owner(fn)}.{name} expects {expected}")
                    break
    return problems


@functools.lru_cache(maxsize=None)
def parameter_hints(fn: Any) -> dict[str, Any]:
    """Parameter name -> resolved annotation (with `Annotated` extras) of a callable or class."""
    target = fn.__init__ if isinstance(fn, type) else fn
    try:
        hints = typing.get_type_hints(target, include_extras=True)
    except Exception:  # noqa: BLE001 - one unresolvable annotation: resolve the others one by one
        hints = _hints_one_by_one(fn, target)
    if isinstance(fn, type) and dataclasses.is_dataclass(fn):
        try:
            fields = typing.get_type_hints(fn, include_extras=True)
        except Exception:  # noqa: BLE001
            fields = {}
        hints = {**{f.name: fields[f.name] for f in dataclasses.fields(fn) if f.name in fields}, **hints}
    hints.pop("return", None)
    return hints


def _hints_one_by_one(fn: Any, target: Any) -> dict[str, Any]:
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return {}
    module = sys.modules.get(getattr(fn, "__module__", ""), None)
    namespace = dict(vars(module)) if module else {}
    namespace.update(getattr(inspect.unwrap(target), "__globals__", {}) or {})
    out = {}
    for name, param in signature.parameters.items():
        annotation = param.annotation
        if annotation is param.empty:
            continue
        if isinstance(annotation, str):
            try:
                annotation = eval(annotation, namespace)  # noqa: S307 - the component's own annotation text
            except Exception:  # noqa: BLE001 - e.g. a name imported only under TYPE_CHECKING
                continue
        out[name] = annotation
    return out


# --------------------------------------------------------------------------- matching
def violation(value: Any, annotation: Any) -> str | None:
    """None when `value` fits `annotation` (or cannot be judged), else what was expected."""
    if isinstance(value, fdl.Buildable):
        return _instance_for_factory(value, annotation)  # otherwise built later: its type is not known yet
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        base, *metadata = typing.get_args(annotation)
        if violation(value, base) is not None:
            return describe(annotation)
        constraints = list(_constraints(metadata))
        if constraints and not all(_satisfies(value, c) for c in constraints):
            return describe(annotation)
        return None
    if origin in (Union, types.UnionType):
        arms = typing.get_args(annotation)
        if any(violation(value, arm) is None for arm in arms):
            return None
        return describe(annotation)
    fits = _fits(value, annotation)
    return None if fits is not False else describe(annotation)


def _instance_for_factory(node: fdl.Buildable, annotation: Any) -> str | None:
    """What was expected, when `node` is an `fdl.Config` of a class whose instances cannot be called given
    where only a factory fits (`records: Callable[[], RolloutRecorder]`): its value is an instance, which
    fails only once the graph is built, after the models load. None in every other case."""
    cls = fdl.get_callable(node)
    if type(node) is not fdl.Config or not isinstance(cls, type):
        return None
    if any("__call__" in vars(k) for k in cls.__mro__ if k is not object):
        return None  # its instances are callables themselves
    base = typing.get_args(annotation)[0] if typing.get_origin(annotation) is Annotated else annotation
    arms = typing.get_args(base) if typing.get_origin(base) in (Union, types.UnionType) else (base,)
    if not all(typing.get_origin(a) is collections.abc.Callable or a in (None, type(None)) for a in arms):
        return None
    return (f"{describe(annotation)}: fdl.Config builds a {cls.__name__} instance, which cannot be called; give "
            f"a factory, fdl.Partial({cls.__name__}, ...)")


def _fits(value: Any, tp: Any) -> bool | None:
    """Whether a value fits a type without metadata; None when that cannot be told."""
    if tp is Any or tp is object:
        return True
    if tp is None or tp is type(None):
        return value is None
    if isinstance(tp, (typing.TypeVar, str, typing.ForwardRef)):
        return None
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        return any(value == a and type(value) is type(a) for a in args)
    if origin is type:
        return isinstance(value, type) and (not args or not isinstance(args[0], type) or issubclass(value, args[0]))
    if origin is collections.abc.Callable:
        return callable(value)
    if origin is not None:
        return _fits_generic(value, origin, args)
    if not isinstance(tp, type):
        return None
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is complex:
        return isinstance(value, (int, float, complex)) and not isinstance(value, bool)
    if issubclass(tp, pathlib.PurePath):
        return isinstance(value, (str, os.PathLike))
    if tp is tuple or tp is list:
        return isinstance(value, (list, tuple))
    try:
        return isinstance(value, tp)
    except TypeError:  # a Protocol that is not runtime-checkable
        return None


def _fits_generic(value: Any, origin: Any, args: tuple) -> bool | None:
    if origin in (tuple, list, collections.abc.Sequence, collections.abc.MutableSequence):
        if not isinstance(value, (list, tuple)) and not (origin is collections.abc.Sequence and isinstance(value, str)):
            return False if isinstance(origin, type) and not isinstance(value, origin) else None
        if isinstance(value, str):
            return None
        if origin is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
            if args == ((),):
                return len(value) == 0
            return len(value) == len(args) and all(violation(v, a) is None for v, a in zip(value, args))
        item = args[0] if args else Any
        return all(violation(v, item) is None for v in value)
    if origin in (dict, collections.abc.Mapping, collections.abc.MutableMapping):
        if not isinstance(value, collections.abc.Mapping):
            return False
        key, item = args if len(args) == 2 else (Any, Any)
        return all(violation(k, key) is None and violation(v, item) is None for k, v in value.items())
    if origin in (set, frozenset, collections.abc.Set):
        return isinstance(value, (set, frozenset, list, tuple)) and all(
            violation(v, args[0] if args else Any) is None for v in value)
    try:
        return isinstance(value, origin)
    except TypeError:
        return None


def _constraints(metadata: Iterable[Any]) -> Iterable[Any]:
    for m in metadata:
        if isinstance(m, at.GroupedMetadata):
            yield from _constraints(m)
        elif isinstance(m, at.BaseMetadata) or isinstance(m, at.Predicate):
            yield m


def _satisfies(value: Any, c: Any) -> bool:
    try:
        if isinstance(c, at.Gt):
            return value > c.gt
        if isinstance(c, at.Ge):
            return value >= c.ge
        if isinstance(c, at.Lt):
            return value < c.lt
        if isinstance(c, at.Le):
            return value <= c.le
        if isinstance(c, at.MultipleOf):
            return value % c.multiple_of == 0
        if isinstance(c, at.MinLen):
            return len(value) >= c.min_length
        if isinstance(c, at.MaxLen):
            return len(value) <= c.max_length
        if isinstance(c, at.Predicate):
            return bool(c.func(value))
    except Exception:  # noqa: BLE001 - a value the constraint cannot even compare does not satisfy it
        return False
    return True  # a marker this checker does not know (e.g. documentation)


# --------------------------------------------------------------------------- text
def describe(annotation: Any) -> str:
    """`int > 0`, `float in (0, 1]`, `int >= 0 | None`, `list[str]`, `one of 'a', 'b'`."""
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        base, *metadata = typing.get_args(annotation)
        bounds = _bounds_text(list(_constraints(metadata)))
        return f"{describe(base)} {bounds}".strip()
    if origin in (Union, types.UnionType):
        return " | ".join(describe(a) for a in typing.get_args(annotation))
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(annotation))
    if annotation is type(None) or annotation is None:
        return "None"
    if isinstance(annotation, type) and origin is None:
        return annotation.__name__
    return repr(annotation).replace("typing.", "").replace("collections.abc.", "")


def _bounds_text(constraints: list[Any]) -> str:
    low = next((c for c in constraints if isinstance(c, (at.Gt, at.Ge))), None)
    high = next((c for c in constraints if isinstance(c, (at.Lt, at.Le))), None)
    parts = []
    if low is not None and high is not None:
        parts.append(f"in {'(' if isinstance(low, at.Gt) else '['}{_bound(low)}, {_bound(high)}"
                     f"{')' if isinstance(high, at.Lt) else ']'}")
    elif low is not None:
        parts.append(f"{'>' if isinstance(low, at.Gt) else '>='} {_bound(low)}")
    elif high is not None:
        parts.append(f"{'<' if isinstance(high, at.Lt) else '<='} {_bound(high)}")
    for c in constraints:
        if isinstance(c, at.MultipleOf):
            parts.append(f"a multiple of {c.multiple_of}")
        elif isinstance(c, at.MinLen):
            parts.append(f"of length >= {c.min_length}")
        elif isinstance(c, at.MaxLen):
            parts.append(f"of length <= {c.max_length}")
        elif isinstance(c, at.Predicate):
            parts.append(f"with {getattr(c.func, '__name__', 'a predicate')}")
    return ", ".join(parts)


def _bound(c: Any) -> Any:
    return next(v for v in (getattr(c, k, None) for k in ("gt", "ge", "lt", "le")) if v is not None)


def _owner(fn: Any) -> str:
    return getattr(fn, "__qualname__", getattr(fn, "__name__", repr(fn)))


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
