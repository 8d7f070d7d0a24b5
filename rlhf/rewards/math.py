"""MATH (Hendrycks) rule reward: the last \\boxed{...} answer, normalised, against the reference.

Normalisation follows the MATH paper's `is_equiv` (which verl's `math.py` copies):
fractions, spacing, \\left/\\right, units, degrees, percent and dollar signs, trailing
periods; two answers match when their normalised strings are equal, or when both are
plain numbers (integers, decimals, fractions) with the same exact value, so
"0.5" == "\\frac12" == "1/2" but "0.33" != "\\frac13".
"""

from __future__ import annotations

import re
from fractions import Fraction

MATH_SOURCES = ("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500")
"""The data_source names verl's MATH preprocessing scripts write; all scored by `math_score`."""


def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} (or \\fbox{...}, or "\\boxed 5"), braces balanced."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    rest = text[start:]
    command = "\\boxed" if rest.startswith("\\boxed") else "\\fbox"
    rest = rest[len(command) :]
    if rest.startswith(" "):  # "\boxed 5": the answer runs to the next "$" or end of text
        return rest.strip().split("$")[0].strip() or None
    if not rest.startswith("{"):
        return None
    depth = 0
    for i, char in enumerate(rest):
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return rest[1:i]
    return None  # unbalanced: the response was cut off inside the box


def _fix_fracs(text: str) -> str:
    """\\frac12 -> \\frac{1}{2}, \\frac1{x} -> \\frac{1}{x}, \\frac{a}b -> \\frac{a}{b}."""
    parts = text.split("\\frac")
    out = parts[0]
    for part in parts[1:]:
        out += "\\frac"
        if part.startswith("{"):
            head, tail = _take_group(part)
            out += head
            part = tail
        else:
            if not part:
                return text
            out += "{" + part[0] + "}"
            part = part[1:]
        if part.startswith("{"):
            out += part
        elif part:
            out += "{" + part[0] + "}" + part[1:]
        else:
            return text
    return out


def _take_group(text: str) -> tuple[str, str]:
    """Split "{...}rest" after its balanced first group; all of it if unbalanced."""
    depth = 0
    for i, char in enumerate(text):
        depth += char == "{"
        depth -= char == "}"
        if depth == 0:
            return text[: i + 1], text[i + 1 :]
    return text, ""


def _fix_sqrt(text: str) -> str:
    """\\sqrt3 -> \\sqrt{3}."""
    return re.sub(r"\\sqrt(\w)", r"\\sqrt{\1}", text)


_UNIT_TEXT = re.compile(r"^(.+?)\\(?:text|mbox|mathrm)\{\s*[a-zA-Z][a-zA-Z\s.^{}0-9]*\}$")
_THOUSANDS = re.compile(r"^-?\d{1,3}(,\d{3})+(\.\d+)?$")


def normalize(answer: str) -> str:
    """A canonical spelling of a MATH answer (the MATH paper's `strip_string`, extended)."""
    s = answer.strip().replace("\n", "").replace("\\!", "")
    s = s.replace("\\\\", "\\")
    s = s.replace("tfrac", "frac").replace("dfrac", "frac")
    s = s.replace("\\left", "").replace("\\right", "")
    s = s.replace("^{\\circ}", "").replace("^\\circ", "").replace("\\circ", "").replace("°", "")
    s = s.replace("\\$", "").replace("$", "")
    s = _UNIT_TEXT.sub(r"\1", s.strip())  # "10\text{ cm}" -> "10"
    s = re.sub(r"\\(?:text|mbox|mathrm)\{(.*?)\}", r"\1", s)  # "\text{Devon}" -> "Devon"
    s = s.replace("\\%", "").replace("%", "")
    s = s.replace("{,}", ",")  # "1{,}000": LaTeX's thousands separator
    s = s.replace("\\,", "").replace("\\;", "").replace("\\ ", "").replace("~", "")
    s = s.strip().rstrip(".").strip()
    if _THOUSANDS.match(s):
        s = s.replace(",", "")
    s = s.replace(" .", " 0.").replace("{.", "{0.")
    if s.startswith("."):
        s = "0" + s
    # "x = 5" and "k=5" -> "5": a short variable name before a single "=".
    if s.count("=") == 1 and len(s.split("=")[0].strip()) <= 2:
        s = s.split("=")[1]
    s = _fix_sqrt(s)
    s = s.replace(" ", "")
    s = _fix_fracs(s)
    if s == "0.5":
        s = "\\frac{1}{2}"
    s = re.sub(r"^(-?\d+)/(\d+)$", r"\\frac{\1}{\2}", s)  # "3/4" -> "\frac{3}{4}"
    return s


_FRAC = re.compile(r"^(-?)\\frac\{(-?\d+)\}\{(-?\d+)\}$")
_DECIMAL = re.compile(r"^-?(\d+\.?\d*|\.\d+)$")


def to_number(normalized: str) -> Fraction | None:
    """The exact value of a normalised answer that is an integer, decimal or numeric
    fraction; None for anything else (expressions, intervals, text)."""
    if _DECIMAL.match(normalized):
        return Fraction(normalized)
    match = _FRAC.match(normalized)
    if match and int(match.group(3)) != 0:
        value = Fraction(int(match.group(2)), int(match.group(3)))
        return -value if match.group(1) else value
    return None


def is_equivalent(answer: str, reference: str) -> bool:
    """Whether two MATH answers agree after normalisation, as strings or as numbers."""
    a, b = normalize(answer), normalize(reference)
    if a == b:
        return True
    x, y = to_number(a), to_number(b)
    return x is not None and x == y


def math_score(solution_str: str, ground_truth: str, extra_info: dict | None = None) -> float:
    """1.0 when the last \\boxed{} answer of the response matches the reference, else 0.0.

    A reference written with its own \\boxed{} (a full MATH solution) is unboxed first.
    """
    answer = last_boxed(solution_str)
    if answer is None:
        return 0.0
    reference = last_boxed(ground_truth) if "\\boxed" in ground_truth else ground_truth
    if reference is None:
        raise ValueError(
            f"math_score: ground truth {ground_truth[:80]!r} has an unbalanced \\boxed{{. "
            "Fix: store the bare answer, as verl's MATH preprocessing does."
        )
    return 1.0 if is_equivalent(answer, reference) else 0.0


def math_answer(text: str) -> str | None:
    """The last \\boxed{...} answer normalised as `math_score` normalises it, for majority voting (maj@k)."""
    boxed = last_boxed(text)
    return normalize(boxed) if boxed is not None else None
