"""How two graphs differ: the changed leaves of their flattened forms (`rlhf diff`, named-run checks).

Both graphs are compared through `rlhf.graph.io.flatten` (defaults materialized), so setting
an argument to its default is no change. `diff_flat` compares two already-flattened dicts, as
a run record stores them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from rlhf.graph.io import flatten

__all__ = ["MISSING", "Change", "diff_flat", "diff_graphs", "format_diff"]


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
    """The leaves (of `flatten`, defaults materialized) whose values differ, by path."""
    return diff_flat(flatten(a), flatten(b))


def diff_flat(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[Change]:
    """The paths of two flat `{path: leaf}` dicts whose values differ (a value of another type differs)."""
    changes = []
    for path in sorted(set(old) | set(new)):
        a, b = old.get(path, MISSING), new.get(path, MISSING)
        if a is MISSING or b is MISSING or not _same(a, b):
            changes.append(Change(path, a, b))
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
