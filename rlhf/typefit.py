"""Whether a value fits a parameter's annotation: its type and its range markers (`rlhf.ranges`).

One matcher for the two places values are checked: preflight (`rlhf.graph.typecheck`) judges every
configured value of a graph before anything is built, and a component built in plain Python judges its own
arguments (`check_arguments`), so a range is written once, as a marker in the signature, and both say the
same `SamplingParams.top_p = 0: expects float in (0, 1]`. Plain Python: no fiddle.

Numbers follow PEP 484's numeric tower (an int fits `float`) but a bool is never taken for a number; a list
fits a `tuple[...]` (command-line literals) when its items fit; a `str` fits a `Path`. What cannot be judged
passes: unresolvable forward references, protocols that are not runtime-checkable, TypeVars.
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
from collections.abc import Callable, Iterable, Mapping
from typing import Annotated, Any, Literal, Union

import annotated_types as at

__all__ = ["check_arguments", "check_fields", "describe", "parameter_hints", "violation"]

# (the type of values built later, a judge saying what was expected of one, or None when it fits)
Unbuilt = tuple[type, Callable[[Any, Any], "str | None"]]


def check_arguments(fn: Callable[..., Any], values: Mapping[str, Any]) -> None:
    """Raise ValueError naming every value in `values` (arguments of `fn` by name) that does not fit its
    parameter's annotation; a parameter without one is not judged."""
    hints = parameter_hints(fn)
    problems = [f"{owner_name(fn)}.{name} = {short_repr(value)}: expects {expected}"
                for name, value in values.items()
                if name in hints and (expected := violation(value, hints[name])) is not None]
    if problems:
        raise ValueError("; ".join(problems))


def check_fields(instance: Any) -> None:
    """`check_arguments` for every field of a dataclass instance (call it from `__post_init__`)."""
    check_arguments(type(instance), {f.name: getattr(instance, f.name) for f in dataclasses.fields(instance)})


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
def violation(value: Any, annotation: Any, unbuilt: Unbuilt | None = None) -> str | None:
    """None when `value` fits `annotation` (or cannot be judged), else what was expected.

    `unbuilt`: (a type, its judge) for values built later (a graph's nodes), whose own type says nothing
    about the built value's: the judge says what was expected of one, or None."""
    if unbuilt is not None and isinstance(value, unbuilt[0]):
        return unbuilt[1](value, annotation)
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        base, *metadata = typing.get_args(annotation)
        if violation(value, base, unbuilt) is not None:
            return describe(annotation)
        constraints = list(_constraints(metadata))
        if constraints and not all(_satisfies(value, c) for c in constraints):
            return describe(annotation)
        return None
    if origin in (Union, types.UnionType):
        arms = typing.get_args(annotation)
        if any(violation(value, arm, unbuilt) is None for arm in arms):
            return None
        return describe(annotation)
    fits = _fits(value, annotation, unbuilt)
    return None if fits is not False else describe(annotation)


def _fits(value: Any, tp: Any, unbuilt: Unbuilt | None) -> bool | None:
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
        return _fits_generic(value, origin, args, unbuilt)
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


def _fits_generic(value: Any, origin: Any, args: tuple, unbuilt: Unbuilt | None) -> bool | None:
    if origin in (tuple, list, collections.abc.Sequence, collections.abc.MutableSequence):
        if not isinstance(value, (list, tuple)) and not (origin is collections.abc.Sequence and isinstance(value, str)):
            return False if isinstance(origin, type) and not isinstance(value, origin) else None
        if isinstance(value, str):
            return None
        if origin is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
            if args == ((),):
                return len(value) == 0
            return len(value) == len(args) and all(violation(v, a, unbuilt) is None for v, a in zip(value, args))
        item = args[0] if args else Any
        return all(violation(v, item, unbuilt) is None for v in value)
    if origin in (dict, collections.abc.Mapping, collections.abc.MutableMapping):
        if not isinstance(value, collections.abc.Mapping):
            return False
        key, item = args if len(args) == 2 else (Any, Any)
        return all(violation(k, key, unbuilt) is None and violation(v, item, unbuilt) is None for k, v in value.items())
    if origin in (set, frozenset, collections.abc.Set):
        return isinstance(value, (set, frozenset, list, tuple)) and all(
            violation(v, args[0] if args else Any, unbuilt) is None for v in value)
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


def owner_name(fn: Any) -> str:
    """The name a message gives a callable: `SamplingParams`, `RewardManager.__init__`'s class."""
    return getattr(fn, "__qualname__", getattr(fn, "__name__", repr(fn)))


def short_repr(value: Any) -> str:
    """`repr(value)`, cut to 80 characters."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
