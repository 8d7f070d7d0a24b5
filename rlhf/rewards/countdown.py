"""Countdown rule reward (TinyZero): an equation over the given numbers that hits the target.

The equation is read from the last <answer>...</answer> and evaluated with `ast`, never
`eval`: only integer literals, + - * / (and unary minus) and parentheses are accepted,
exactly, as fractions, so no input can run code, allocate huge numbers or recurse deeply.

Rewards: `score` when the equation uses each given number exactly once and equals the
target (within 1e-5); `format_score` for any other well-formed equation (wrong numbers,
wrong value, division by zero); 0.0 when there is no <answer> or its content is not
such an equation (text, "=", "**", unknown symbols, over `MAX_CHARS` characters).
"""

from __future__ import annotations

import ast
import json
import operator
import re
from collections import Counter
from collections.abc import Mapping
from fractions import Fraction

MAX_CHARS = 200
"""Longest equation evaluated; longer ones score 0 (a real answer is ~20 characters)."""

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_ALLOWED_CHARS = re.compile(r"[\d+\-*/().\s]+")
_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}


class _NotAnEquation(ValueError):
    """The answer is not an expression over integers with + - * / and parentheses."""


def extract_answer(solution_str: str) -> str | None:
    """The stripped content of the last <answer>...</answer>, or None."""
    found = _ANSWER.findall(solution_str)
    return found[-1].strip() if found else None


def parse_equation(equation: str) -> tuple[ast.expr, list[int]]:
    """Parse `equation` into its AST and the integers it uses; raise `_NotAnEquation` otherwise."""
    equation = " ".join(equation.split())  # a line break inside the tags is not a syntax error
    if not equation or len(equation) > MAX_CHARS or not _ALLOWED_CHARS.fullmatch(equation):
        raise _NotAnEquation(equation)
    try:
        tree = ast.parse(equation, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError) as err:
        raise _NotAnEquation(equation) from err
    numbers: list[int] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant):
            if type(node.value) is not int:
                raise _NotAnEquation(equation)
            numbers.append(node.value)
        elif not isinstance(node, (ast.BinOp, ast.UnaryOp, *_BINARY, *_UNARY)) or (
            isinstance(node, ast.BinOp) and type(node.op) not in _BINARY
        ):
            raise _NotAnEquation(equation)
    return tree, numbers


def evaluate(node: ast.expr) -> Fraction:
    """Exact value of a parsed equation; ZeroDivisionError on division by zero."""
    if isinstance(node, ast.Constant):
        return Fraction(node.value)
    if isinstance(node, ast.UnaryOp):
        return _UNARY[type(node.op)](evaluate(node.operand))
    return _BINARY[type(node.op)](evaluate(node.left), evaluate(node.right))


def parse_ground_truth(ground_truth: str | Mapping) -> tuple[int, list[int]]:
    """(target, numbers) from the JSON string {"target": T, "numbers": [...]} or such a dict."""
    try:
        data = json.loads(ground_truth) if isinstance(ground_truth, str) else ground_truth
        return int(data["target"]), [int(x) for x in data["numbers"]]
    except (TypeError, KeyError, ValueError) as err:
        raise ValueError(
            f'countdown_score: ground truth {ground_truth!r} is not {{"target": T, "numbers": [...]}}. '
            "Fix: store it as that JSON string (countdown_rows does)."
        ) from err


def countdown_score(
    solution_str: str,
    ground_truth: str | Mapping,
    extra_info: dict | None = None,
    *,
    format_score: float = 0.1,
    score: float = 1.0,
) -> float:
    """Reward a Countdown answer (see the module docstring for the three outcomes).

    format_score: reward for a well-formed equation that is wrong (TinyZero's 0.1).
    score: reward for a correct equation.
    """
    target, numbers = parse_ground_truth(ground_truth)
    equation = extract_answer(solution_str)
    if equation is None:
        return 0.0
    try:
        tree, used = parse_equation(equation)
    except _NotAnEquation:
        return 0.0
    if Counter(used) != Counter(numbers):
        return float(format_score)
    try:
        value = evaluate(tree)
    except ZeroDivisionError:
        return float(format_score)
    return float(score) if abs(value - target) < Fraction(1, 100_000) else float(format_score)
