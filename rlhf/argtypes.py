"""Command-line numbers checked where they are parsed, and a parser whose errors are one line.

`rlhf generate`, `eval`, `serve` and `plan --memory` declare each flag's range in its argparse
type (`number(int, 1)`), so `--max-sessions 0` stops at once with `argument --max-sessions: must
be >= 1, got 0` and exit status 2, before a model loads or a server starts (instead of a 500 on
every request later). Plain Python, below every package that parses arguments.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

__all__ = ["POSITIVE", "OneLineParser", "number"]


def number(kind: type, low: float, high: float | None = None, low_open: bool = False) -> Callable[[str], float]:
    """An argparse type: a `kind` number in [low, high] ((low, high] with `low_open`), else one clear line."""
    bounds = f"{'>' if low_open else '>='} {low:g}" + (f" and <= {high:g}" if high is not None else "")

    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'}, got {text!r}")
        if value < low or (low_open and value == low) or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"must be {bounds}, got {text}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


POSITIVE = number(int, 1)


class OneLineParser(argparse.ArgumentParser):
    """argparse with its errors in one line (the usage block is what --help is for)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")
