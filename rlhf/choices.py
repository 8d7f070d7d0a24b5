"""Validate a string switch against its `Literal` type where the value arrives (at construction).

A string that chooses a code path (`on_error="raise" | "skip"`) is typed as a `Literal`; checking it
against that same type means the allowed values are written once, and a typo fails at once with an
error naming them, instead of quietly taking the `else` branch later.
"""

from __future__ import annotations

from typing import Any, get_args


def check_choice(where: str, value: Any, choices: Any) -> None:
    """Raise ValueError unless `value` is one of the values of the `Literal` type `choices`."""
    allowed = get_args(choices)
    if value not in allowed:
        raise ValueError(f"{where} must be one of {', '.join(map(repr, allowed))}, got {value!r}")
