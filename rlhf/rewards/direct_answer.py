"""A gold rule about style, not length: does the answer open by naming what was asked about?

"What is a comet?" -> "A comet is a small, icy body ..." opens with its subject (a direct answer);
"In the vast darkness of space, ..." or "Great question! ..." does not. The rule reads only the
answer's first `words` words, so length is not part of it; yet on SmolLM2's pairs "the longer answer wins" was
right 60.4% of the time (answers that name their subject early run on a little longer within a 32-token cut;
benchmarks/preference_pipeline.py with experiments/smollm2_rlhf.py). It is the labeller of that pipeline's preference pairs and the gold score
watched beside the learned reward model in RL.

Rows (`rlhf.data.generators.topic_prompt_rows`, data_source "direct_answer") carry the subject as their
ground truth, e.g. "comet"; a word counts when it starts with the subject ("comets" for "comet").
"""

from __future__ import annotations

import re

_WORDS = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")


def subject_position(response: str, subject: str) -> int | None:
    """The index of the first word of `response` that starts with `subject` (case-insensitive), or None."""
    subject = subject.strip().lower()
    for index, word in enumerate(_WORDS.findall(response.lower())):
        if subject and word.startswith(subject):
            return index
    return None


def direct_answer_score(solution_str: str, ground_truth: str, extra_info: dict | None = None, *,
                        words: int = 3) -> dict[str, float]:
    """1.0 when the answer names its subject (`ground_truth`) among its first `words` words, else 0.0.
    `position` reports where the subject first appears (-1: nowhere), so a run can see how answers open."""
    position = subject_position(solution_str, str(ground_truth))
    return {"score": float(position is not None and position < words),
            "position": float(position if position is not None else -1)}
