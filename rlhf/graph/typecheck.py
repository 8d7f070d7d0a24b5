"""Every configured value against its parameter's annotation, before anything is built.

One mechanism for the whole graph: for each node, the callable's signature gives each
parameter's type (`typing.get_type_hints`, `Annotated` kept) and the range markers of
`rlhf.ranges` (`Annotated[int, Positive]`, `Interval(gt=0, le=1)`, any `annotated_types`
marker). `annotation_problems(nodes)` returns one line per explicitly set value that does
not fit, naming its path, its value and what was expected:

    stages.grpo.total_steps = 'ten': RLTrainer.total_steps expects int > 0

The matching itself (types, range markers, their text) is `rlhf.typefit`'s, which components use
to check their own arguments when built in plain Python; here a sub-graph passes (its built type is
known only after building), except an `fdl.Config` instance given where a factory is expected.

Third-party callables cannot carry our markers; `external_ranges()` adds them for the few
arguments every experiment sets (a torch optimizer's `lr`).
"""

from __future__ import annotations

import collections.abc
import sys
import types
import typing
from collections.abc import Iterable
from typing import Annotated, Any, Union

import annotated_types as at
import fiddle as fdl

from rlhf import typefit
from rlhf.typefit import describe, owner_name, parameter_hints, short_repr

__all__ = ["annotation_problems", "violation", "describe", "external_ranges", "parameter_hints"]


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
                    problems.append(f"{where} = {short_repr(value)}: {owner_name(fn)}.{name} expects {expected}")
                    break
    return problems


# --------------------------------------------------------------------------- matching
def violation(value: Any, annotation: Any) -> str | None:
    """`rlhf.typefit.violation`, where a graph node stands for the value it builds (not judged by its type)."""
    return typefit.violation(value, annotation, (fdl.Buildable, _instance_for_factory))


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
