"""GSM8K rule reward: compare the response's final number with the reference answer.

Follows verl's `gsm8k.compute_score` (strict reads the number after the last "####",
flexible the last number anywhere) and is more forgiving about how a correct number
is written: "#### $1,234.", "####1234", "#### **1,234**" and "1234.00" all match "1234".
Numbers are compared as decimals, so "72" == "72.0" but "72" != "72.5".
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from decimal import Decimal, InvalidOperation
from types import MappingProxyType
from typing import Literal

# A number: optional minus (not the one in "3-4"), digits with optional thousands
# commas, optional decimals. It always ends in a digit, so "72." and "72," give "72".
_NUMBER = r"(?:(?<![\w.)])-)?\d(?:[\d,]*\d)?(?:\.\d+)?"
_STRICT = re.compile(r"####[\s*$\\]*(" + _NUMBER + ")")
_ANY_NUMBER = re.compile(_NUMBER)


def extract_strict(text: str) -> str | None:
    """The number right after the last "####" that is followed by one (verl's strict rule)."""
    found = _STRICT.findall(text)
    return found[-1] if found else None


def extract_flexible(text: str) -> str | None:
    """The last number anywhere in the text (verl's flexible rule)."""
    found = _ANY_NUMBER.findall(text)
    return found[-1] if found else None


Method = Literal["strict", "flexible"]
EXTRACTORS: Mapping[str, Callable[[str], "str | None"]] = MappingProxyType(
    {"strict": extract_strict, "flexible": extract_flexible}
)
"""The number-extraction rule of each `method`, the one table `gsm8k_score` and `gsm8k_answer` read."""


def extractor(method: Method) -> Callable[[str], "str | None"]:
    """The extraction rule named `method`; a ValueError naming the allowed methods otherwise."""
    if method not in EXTRACTORS:
        raise ValueError(f"GSM8K: method must be one of {sorted(EXTRACTORS)}, got {method!r}")
    return EXTRACTORS[method]


def to_decimal(number: str) -> Decimal | None:
    """"$1,234.50" -> Decimal("1234.50"); None when it is not a number."""
    cleaned = number.strip().replace(",", "").replace("$", "").rstrip(".")
    try:
        value = Decimal(cleaned)
    except InvalidOperation:
        return None
    return value if value.is_finite() else None


def gsm8k_score(
    solution_str: str,
    ground_truth: str,
    extra_info: dict | None = None,
    *,
    method: Method = "strict",
    format_score: float = 0.0,
    score: float = 1.0,
) -> float:
    """`score` if the extracted answer equals `ground_truth`, `format_score` if an answer
    was found but is wrong, 0.0 if none was found.

    method: "strict" reads the number after the last "####" (the format the prompt asks
      for); "flexible" the last number in the response.
    format_score: reward for a well-formed but wrong answer (verl's default 0).
    score: reward for a correct answer.
    """
    answer = extractor(method)(solution_str)
    if answer is None:
        return 0.0
    expected = to_decimal(str(ground_truth))
    if expected is None:
        raise ValueError(
            f"gsm8k_score: ground truth {ground_truth!r} is not a number. Fix: store the final "
            "number only (e.g. \"1234\"), as verl's GSM8K preprocessing does."
        )
    return float(score) if to_decimal(answer) == expected else float(format_score)


def gsm8k_strict(solution_str: str, ground_truth: str, extra_info: dict | None = None) -> float:
    """`gsm8k_score` with method="strict" and verl's default rewards."""
    return gsm8k_score(solution_str, ground_truth, extra_info, method="strict")


def gsm8k_flexible(solution_str: str, ground_truth: str, extra_info: dict | None = None) -> float:
    """`gsm8k_score` with method="flexible" and verl's default rewards."""
    return gsm8k_score(solution_str, ground_truth, extra_info, method="flexible")


def gsm8k_answer(text: str, method: Method = "strict") -> Decimal | None:
    """The GSM8K final number as a Decimal, for majority voting (maj@k: "1,234" and "1234.0" vote
    together), read by the same rule as `gsm8k_score` with the same `method`."""
    found = extractor(method)(text)
    return to_decimal(found) if found is not None else None
