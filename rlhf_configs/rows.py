"""Fewer rows for a dataset node, whatever makes them: what a recipe's `smoke` fiddler needs.

A smoke fiddler that writes `stage.train_data.rows.n = 16` works only on the recipe's own generator;
once a user follows the docs and puts `fdl.Config(load_rows, path=...)` there, the same line fails
(load_rows has no `n`). `limit_rows` finds the right knob instead.
"""

from __future__ import annotations

import inspect

import fiddle as fdl


def limit_rows(dataset: fdl.Config, n: int) -> None:
    """Make the node `dataset` (anything with a `rows` argument: PromptDataset, SFTDataset,
    tool_demonstrations...) read at most `n` rows, by what gives its rows:

    - a generator with an `n` argument (`arithmetic_rows`, `reasoning_gym_rows`): its `n`;
    - a reader with a `limit` argument (`load_rows`): its `limit`;
    - a node that transforms rows given as its own `rows` argument (a prompt rewriter, tool demonstrations):
      that node's rows, the same way;
    - a list of rows: its first `n`.

    Anything else is a ValueError that names the node and the fix.
    """
    rows = getattr(dataset, "rows", None)
    if isinstance(rows, (list, tuple)):
        dataset.rows = list(rows[:n])
        return
    if isinstance(rows, fdl.Buildable):
        parameters = inspect.signature(fdl.get_callable(rows)).parameters
        if "n" in parameters:
            rows.n = n
            return
        if "limit" in parameters:
            rows.limit = n
            return
        if "rows" in parameters and getattr(rows, "rows", None) is not None:
            limit_rows(rows, n)
            return
    raise ValueError(
        f"limit_rows: cannot make {dataset!r} read fewer rows: its rows come from {rows!r}, which has no `n` or "
        "`limit` argument and no `rows` of its own. Fix: read them with load_rows(path=..., limit=...) or a "
        "generator with an `n` argument, or set the number of rows in your own fiddler."
    )
