"""Range markers for constructor arguments: `prompts_per_step: Annotated[int, Positive] = 16`.

A component declares the values an argument may take in its signature, next to its default;
preflight (`rlhf.graph.typecheck`) reads every signature of the graph and checks each
configured value against its type and these markers before anything is built, so a `0` or a
`"ten"` fails in a second, naming its path, instead of as a ZeroDivisionError after the models
have loaded. The markers are the `annotated-types` package's (as pydantic and msgspec read
them); this module only names the common ones. Plain Python: no fiddle, safe to import from
any component.
"""

from __future__ import annotations

from typing import Annotated

from annotated_types import Ge, Gt, Interval, Le, Lt, MultipleOf

__all__ = [
    "Ge", "Gt", "Interval", "Le", "Lt", "MultipleOf",
    "Positive", "NonNegative", "UnitInterval", "OpenUnitInterval",
    "PositiveInt", "NonNegativeInt", "PositiveFloat", "NonNegativeFloat",
]

Positive = Gt(0)  # > 0: counts of things that must exist (steps, rows, workers)
NonNegative = Ge(0)  # >= 0: frequencies where 0 means "off", temperatures, warm-up steps
UnitInterval = Interval(ge=0, le=1)  # a probability or fraction, ends included
OpenUnitInterval = Interval(gt=0, le=1)  # top_p: 0 would keep no token

PositiveInt = Annotated[int, Positive]
NonNegativeInt = Annotated[int, NonNegative]
PositiveFloat = Annotated[float, Positive]
NonNegativeFloat = Annotated[float, NonNegative]
