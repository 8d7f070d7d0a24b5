"""Rewards for short answers (the arithmetic task): the response is the answer.

`exact_match_score` is the task's reward; `digit_match_score` gives partial credit, a dense signal
for a barely trained model (it almost never samples an exact answer, so every reward would be 0).
"""

from __future__ import annotations

END_MARKERS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end|>", "</s>")
"""End-of-turn tokens that decoding may leave at the end of a response."""


def exact_match_score(
    solution_str: str,
    ground_truth: str,
    extra_info: dict | None = None,
    *,
    end_markers: tuple[str, ...] = END_MARKERS,
) -> float:
    """1.0 when the response, without surrounding whitespace and trailing end markers,
    equals the ground truth; else 0.0. Nothing else is forgiven ("68." and "068" are wrong),
    which is what makes it a sharp signal for a tiny model.

    end_markers: trailing strings removed (repeatedly) before comparing.
    """
    return 1.0 if _answer(solution_str, end_markers) == str(ground_truth).strip() else 0.0


def digit_match_score(
    solution_str: str,
    ground_truth: str,
    extra_info: dict | None = None,
    *,
    end_markers: tuple[str, ...] = END_MARKERS,
) -> float:
    """Partial credit: characters equal to the ground truth's at the same place counted from the
    right (units under units), over the longer of the two lengths. 1.0 exactly when
    `exact_match_score` is 1.0; "104" for "114" scores 2/3, "14" 2/3, "1140" 1/4 (only the 1 lines up).

    end_markers: trailing strings removed (repeatedly) before comparing.
    """
    text, truth = _answer(solution_str, end_markers), str(ground_truth).strip()
    longest = max(len(text), len(truth))
    if longest == 0:
        return 1.0
    same = sum(a == b for a, b in zip(reversed(text), reversed(truth)))
    return same / longest


def arithmetic_answer(text: str) -> str | None:
    """The answer `exact_match_score` compares, for majority voting (maj@k): the response without
    whitespace and trailing end-of-turn markers; None when nothing is left."""
    return _answer(text, END_MARKERS) or None


def _answer(solution_str: str, end_markers: tuple[str, ...]) -> str:
    """The response without surrounding whitespace and trailing end markers."""
    text = solution_str.strip()
    stripped = True
    while stripped:
        stripped = False
        for marker in end_markers:
            if marker and text.endswith(marker):
                text = text[: -len(marker)].rstrip()
                stripped = True
    return text
