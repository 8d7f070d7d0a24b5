"""A callable's arguments completed with its signature's defaults: defaults stay written once, in signatures.

Code that reasons about a component before it is built (the preflight, the memory planner, a plan line)
gets the component's arguments as a dict, often without the ones left at their defaults. Reading them
through `with_defaults` instead of `arguments.get(key, default)` keeps the default in the signature alone.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["with_defaults"]


def with_defaults(fn: Callable[..., Any], given: Mapping[str, Any]) -> dict[str, Any]:
    """`given` over the defaults of `fn`'s signature (a class: its constructor's); a required argument not
    given is missing from the result, and a name `fn` does not take is an error naming it."""
    parameters = inspect.signature(fn).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    unknown = [k for k in given if k not in parameters and not takes_any]
    if unknown:
        name = getattr(fn, "__qualname__", repr(fn))
        raise TypeError(f"{name} takes no argument {', '.join(map(repr, unknown))}; it takes "
                        f"{', '.join(parameters)}")
    defaults = {k: p.default for k, p in parameters.items()
                if p.default is not inspect.Parameter.empty and p.kind is not inspect.Parameter.VAR_KEYWORD}
    return {**defaults, **given}
