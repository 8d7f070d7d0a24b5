"""Exact-match reward for short answers (the arithmetic task): the response is the answer."""

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
    text = solution_str.strip()
    stripped = True
    while stripped:
        stripped = False
        for marker in end_markers:
            if marker and text.endswith(marker):
                text = text[: -len(marker)].rstrip()
                stripped = True
    return 1.0 if text == str(ground_truth).strip() else 0.0
