"""The components' own preflight hooks: one part of the preflight (`rlhf.runtime.preflight`).

Any callable in a graph may carry a `preflight(arguments)` attribute (a plain function or
staticmethod taking the node's arguments as a dict); `hook_problems(graph)` calls it for every
node and returns every failure at once (the preflight raises them with its other problems).
Components opt in with a plain attribute: they import nothing from here, and no fiddle.

Arguments that are still unresolved (`StageOutput`, sub-graphs) reach a hook as
`fdl.Buildable`s: a hook checks only the values it can see. A hook with `wants_values = True`
(a dataset that must read its rows with its tokenizer) gets the arguments that are loaders built first: sub-graphs whose callable has a preflight hook of its
own (`load_rows`, `load_tokenizer`), so preflight reads them anyway. One that cannot be built
now (a stage output, a missing file that its own hook reports) reaches it as the `fdl.Buildable`.
"""

from __future__ import annotations

from typing import Any

import fiddle as fdl
from fiddle import daglish

__all__ = ["hook_problems"]


def hook_problems(graph: Any) -> list[str]:
    """Every failing hook as a line `- at PATH: message` (empty when all pass)."""
    seen: set[int] = set()
    problems: list[str] = []
    for value, path in daglish.iterate(graph):
        if isinstance(value, fdl.Buildable) and id(value) not in seen:
            seen.add(id(value))
            hook = getattr(fdl.get_callable(value), "preflight", None)
            if callable(hook):
                try:
                    arguments = fdl.ordered_arguments(value, include_defaults=True)
                    if getattr(hook, "wants_values", False):
                        arguments = {name: _built(argument) for name, argument in arguments.items()}
                    hook(arguments)
                except Exception as err:  # noqa: BLE001 - every problem is reported, then raised
                    where = daglish.path_str(path) or "<root>"
                    message = f"- at {where}: {err}"
                    if message not in problems:
                        problems.append(message)
    return problems


def _built(value: Any) -> Any:
    """`value` built when it is a loader's sub-graph (its callable has a preflight hook) that builds now,
    else `value` itself."""
    if not isinstance(value, fdl.Buildable) or not callable(getattr(fdl.get_callable(value), "preflight", None)):
        return value
    try:
        return fdl.build(value)
    except Exception:  # noqa: BLE001 - reported by the sub-graph's own hook, or resolved later (stage outputs)
        return value
