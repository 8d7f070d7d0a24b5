"""The final answer of a free-form response: what the prompt asked for ("Answer: ..."), or what a model gave anyway.

A task that lets the model reason before answering needs one place the answer is read from, or the
scorer guesses (and a guessing scorer can be gamed). `final_answer` reads the asked-for form, a last
line "Answer: <answer>", and accepts `\\boxed{...}` (what math-tuned models write unasked).
`lenient_answers` lists what a reader ignoring the format would take as the answer; it measures
what a model knows before it has learnt the format (`FinalAnswerScorer` reports both).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from rlhf.rewards.arithmetic import END_MARKERS
from rlhf.rewards.math import last_boxed

_BOLD = r"(?:\*\*|__)?"
_ANSWER_LINE = re.compile(rf"^[ \t]*{_BOLD}[ \t]*answer[ \t]*{_BOLD}[ \t]*:[ \t]*{_BOLD}(?P<rest>)", re.I | re.M)
# a number: optional sign, digits with optional thousands commas, optional decimals
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def _without_end_markers(text: str) -> str:
    """`text` without surrounding whitespace and trailing end-of-turn markers."""
    text = text.strip()
    while marker := next((m for m in END_MARKERS if text.endswith(m)), None):
        text = text[: -len(marker)].rstrip()
    return text


def _clean(answer: str) -> str:
    """The answer without markdown wrappers (`**42**`, `` `42` ``, code fences, `$42$`) and a full stop after a
    number."""
    answer = answer.strip()
    for wrapper in ("**", "__", "```", "`", "$"):
        if len(answer) > 2 * len(wrapper) and answer.startswith(wrapper) and answer.endswith(wrapper):
            answer = answer[len(wrapper) : -len(wrapper)].strip()
        elif answer.endswith(wrapper) and wrapper in ("**", "__") and wrapper not in answer[:-len(wrapper)]:
            answer = answer[: -len(wrapper)].strip()  # "**Answer: 42**": the bold opened before "Answer"
    if re.search(r"\d\.$", answer):  # "Answer: 292." ends a sentence; the number is 292
        answer = answer[:-1]
    return answer


def final_answer(response: str) -> str | None:
    """The text after the LAST line-initial "Answer:" (any case, markdown bold tolerated) to the end of the
    response (answers may span lines: grids, lists), else the content of the last `\\boxed{...}`, else None.
    An "Answer:" with nothing after it counts as absent."""
    text = _without_end_markers(response)
    matches = list(_ANSWER_LINE.finditer(text))
    answer = _clean(text[matches[-1].start("rest"):]) if matches else ""
    if answer:
        return answer
    boxed = last_boxed(text)
    return boxed.strip() if boxed is not None and boxed.strip() else None


def lenient_answers(response: str) -> list[str]:
    """What a reader ignoring the asked-for format would take as the answer, in this order, without repeats:
    the final answer (if any), the last non-empty line, the last number (thousands commas removed)."""
    text = _without_end_markers(response)
    found = []
    final = final_answer(text)
    if final is not None:
        found.append(final)
    lines = [line for line in text.splitlines() if line.strip()]
    if lines:
        found.append(_clean(lines[-1]))
    numbers = _NUMBER.findall(text)
    if numbers:
        found.append(numbers[-1].replace(",", ""))
    return [answer for answer in dict.fromkeys(found) if answer]


AnswerScore = Callable[[str, Any, Any], "float | Mapping"]


class FinalAnswerScorer:
    """Score a response by its final answer: `{"score", "lenient", "format", "partial"}` from a scorer of bare
    answers.

    score: `inner(final_answer(response), ...)`, 0 when there is none (the reward: right AND in the format).
    lenient: the best `inner` score over `lenient_answers(response)` (at least `score`): what the model knows,
      format aside. Report it; do not train on it (the last number of a wrong derivation is often right).
    format: 1.0 when the response has a final answer, else 0.0.
    partial: 1.0 when `score` is strictly between 0 and 1 (credit for an answer that is not right: some
      reasoning-gym tasks give len(truth)/len(answer) to an answer containing the truth), else 0.0.

    `inner(answer, ground_truth, extra_info)` is any scorer (e.g. `exact_match_score`); a dict result counts by
    its "score". The manager reports the other keys beside the score (`reward_extra/...`).
    """

    def __init__(self, inner: AnswerScore) -> None:
        if not callable(inner):
            raise TypeError(f"FinalAnswerScorer: inner must be a scorer of answers, got {inner!r}")
        self.inner = inner

    def _score(self, answer: str, ground_truth: Any, extra_info: Any) -> float:
        result = self.inner(answer, ground_truth, extra_info)
        return float(result["score"] if isinstance(result, Mapping) else result)

    def __call__(self, solution_str: str, ground_truth: Any, extra_info: Any = None) -> dict[str, float]:
        final = final_answer(solution_str)
        score = self._score(final, ground_truth, extra_info) if final is not None else 0.0
        lenient = max([score, *(self._score(a, ground_truth, extra_info) for a in lenient_answers(solution_str))])
        return {"score": score, "lenient": lenient, "format": 1.0 if final is not None else 0.0,
                "partial": 1.0 if 0.0 < score < 1.0 else 0.0}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FinalAnswerScorer) and other.inner == self.inner

    def __hash__(self) -> int:
        return hash((FinalAnswerScorer, self.inner))

    def __repr__(self) -> str:
        return f"FinalAnswerScorer({getattr(self.inner, '__name__', self.inner)!r})"


class LenientScorer:
    """`FinalAnswerScorer(inner)`'s "lenient" value as the score: right, format aside. For validation beside the
    strict reward (`Evaluator(aux_rewards={"lenient": RewardManager({...: LenientScorer(inner)})})` logs
    `val-aux/<source>/lenient/mean@<n>`), not for training: the last number of a wrong derivation is often right."""

    def __init__(self, inner: AnswerScore) -> None:
        self.scorer = FinalAnswerScorer(inner)

    def __call__(self, solution_str: str, ground_truth: Any, extra_info: Any = None) -> float:
        return self.scorer(solution_str, ground_truth, extra_info)["lenient"]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LenientScorer) and other.scorer == self.scorer

    def __hash__(self) -> int:
        return hash((LenientScorer, self.scorer))

    def __repr__(self) -> str:
        return f"LenientScorer({getattr(self.scorer.inner, '__name__', self.scorer.inner)!r})"
