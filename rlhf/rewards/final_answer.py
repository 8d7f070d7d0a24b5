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
# "The answer is 42." (what the default instruction asks for: small instruct models follow it), to the end of its line
_ANSWER_IS = re.compile(rf"\bthe (?:final )?answer is[ \t]*:?[ \t]*{_BOLD}(?P<rest>[^\n]*)", re.I)


def _without_end_markers(text: str) -> str:
    """`text` without surrounding whitespace and trailing end-of-turn markers."""
    text = text.strip()
    while marker := next((m for m in END_MARKERS if text.endswith(m)), None):
        text = text[: -len(marker)].rstrip()
    return text


_QUOTES = (('"', '"'), ("'", "'"), ("\u201c", "\u201d"), ("\u2018", "\u2019"))
"""Quote pairs around a whole answer: asked for `End your reply with "The answer is <answer>."`, SmolLM2 quoted 47 of
48 yes/no answers (`The answer is "No"`) and every word answer of letter_jumble and spell_backward."""


def _clean(answer: str) -> str:
    """The answer without markdown wrappers (`**42**`, `` `42` ``, code fences, `$42$`), without quotes around the
    whole of it (`"No"`, `'dog'`, curly ones; one pair, and only where no other quote of that kind is inside), and
    without a full stop after a number."""
    answer = answer.strip()
    for wrapper in ("**", "__", "```", "`", "$"):
        if len(answer) > 2 * len(wrapper) and answer.startswith(wrapper) and answer.endswith(wrapper):
            answer = answer[len(wrapper) : -len(wrapper)].strip()
        elif answer.endswith(wrapper) and wrapper in ("**", "__") and wrapper not in answer[:-len(wrapper)]:
            answer = answer[: -len(wrapper)].strip()  # "**Answer: 42**": the bold opened before "Answer"
    inner = answer[1:-1]
    if len(answer) > 2 and any(answer[0] == opening and answer[-1] == closing and opening not in inner
                               and closing not in inner for opening, closing in _QUOTES):
        answer = inner.strip()
    if re.search(r"\d\.$", answer):  # "Answer: 292." ends a sentence; the number is 292
        answer = answer[:-1]
    return answer


def _read_final_answer(text: str) -> tuple[str, int] | None:
    """(the final answer, where the text it was read from ends) in `text` (end markers already dropped); None when
    there is none. The one reader behind `final_answer` and `answer_ends_reply`."""
    matches = list(_ANSWER_LINE.finditer(text))
    answer = _clean(text[matches[-1].start("rest"):]) if matches else ""
    if answer:
        return answer, len(text)  # an "Answer:" line runs to the end
    sentences = list(_ANSWER_IS.finditer(text))
    if sentences:
        answer = _clean(sentences[-1].group("rest"))
        answer = _clean(answer[:-1]) if answer.endswith(".") else answer
        if answer:
            return answer, sentences[-1].end()  # the end of its line
    boxed = last_boxed(text)
    if boxed is None or not boxed.strip():
        return None
    line_end = text.find("\n", max(text.rfind("\\boxed"), text.rfind("\\fbox")))
    return boxed.strip(), len(text) if line_end < 0 else line_end


def final_answer(response: str) -> str | None:
    """The text after the LAST line-initial "Answer:" (any case, markdown bold tolerated) to the end of the
    response (answers may span lines: grids, lists); else the rest of the line of the last "The answer is ..."
    (the form `rlhf.data.reasoning_gym.ANSWER_INSTRUCTION` asks for), without a closing full stop; else the
    content of the last `\\boxed{...}`; else None. A marker with nothing after it counts as absent."""
    read = _read_final_answer(_without_end_markers(response))
    return read[0] if read else None


def answer_ends_reply(response: str) -> bool:
    """Whether the reply ends with its final answer, as an instruction "End your reply with ..." asks: nothing but
    whitespace after the line `final_answer` read it from (an "Answer:" line runs to the end by construction).
    False when there is no final answer, and for a reply that goes on after it: a justification written after the
    answer, the answer said again and then a different one, a reply the response budget cut off mid-sentence."""
    text = _without_end_markers(response)
    read = _read_final_answer(text)
    return read is not None and not text[read[1]:].strip()


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


def _full_credit(value: float) -> bool:
    """Right: the task's own scorer gave full credit (reasoning-gym's give fractions to wrong answers that contain
    the truth: "18" for 1 earns 0.5 on letter_counting)."""
    return value >= 1.0


class Correct:
    """1.0 when `scorer` gives a response full credit, else 0.0: held-out accuracy, where a scorer's partial credit
    for wrong answers would count as a fraction of a right one."""

    def __init__(self, scorer: Callable[..., Any]) -> None:
        if not callable(scorer):
            raise TypeError(f"Correct: scorer must be callable, got {scorer!r}")
        self.scorer = scorer

    def __call__(self, solution_str: str, ground_truth: Any, extra_info: Any = None) -> float:
        result = self.scorer(solution_str, ground_truth, extra_info)
        return 1.0 if _full_credit(float(result["score"] if isinstance(result, Mapping) else result)) else 0.0

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Correct) and other.scorer == self.scorer

    def __hash__(self) -> int:
        return hash((Correct, self.scorer))

    def __repr__(self) -> str:
        return f"Correct({self.scorer!r})"


class RightAnswerReward:
    """A reward that pays only for right answers: 1.0 for a right answer in the asked-for form, `unformatted_credit`
    for a right answer without it (read leniently: the last line or last number), 0.0 for anything else. Right means
    full credit from the task's scorer: a task's partial credit for a wrong answer is not paid (`task_partial`
    reports where it would have been).

    Why: a small model rarely writes the asked-for form at first on some prompts, so a reward for the form alone
    gives GRPO nothing to compare; credit for answers that merely look right is farmable (the policy learns to emit
    plausible wrong answers: on letter_counting, reasoning-gym's own 0.5 for "18" where the truth is 1 took SmolLM2
    from 54% to 18% held-out). Here every credited sample is right, and a right answer in the form always earns
    more than one without it, so the form is learnt only as a way to be right more often.
    Keep the credit small: GRPO normalises advantages per group, so a lone right answer among wrong ones gets the
    same push whatever its credit, while a small credit lets a right answer in the form outrank unformatted right
    answers in the same group (with 0.5, SmolLM2 learnt to be right without the form: 0% strict, 60% lenient).
    `partial` is 1.0 when the reward came only from the unformatted credit, which the RL metrics report per step
    (`reward/extra/<source>/partial/mean`).

    `answer_last`: full credit also needs the reply to END with its answer (`answer_ends_reply`), as the
    instruction asks; a right answer followed by more text earns the unformatted credit. Why: read wherever it
    stands, a right answer pays the same with anything after it, so whatever follows is reinforced with it; on
    SmolLM2 the replies grew into repeated answers and after-the-fact justifications until nearly every held-out
    reply reached the response budget (basic_arithmetic: 0% -> 99.5% within 8 steps), and each step grew as slow.
    `answer_last` (1.0 when the reply ends with its answer) is reported either way."""

    def __init__(self, scorer: Callable[..., Mapping], unformatted_credit: float = 0.1,
                 answer_last: bool = False) -> None:
        if not callable(scorer):
            raise TypeError(f"RightAnswerReward: scorer must be a FinalAnswerScorer-like callable, got {scorer!r}")
        if not 0.0 <= unformatted_credit < 1.0:
            raise ValueError(f"RightAnswerReward: unformatted_credit must be in [0, 1), got {unformatted_credit}: "
                             "a right answer in the asked-for form must earn more than one without it")
        self.scorer = scorer
        self.unformatted_credit = unformatted_credit
        self.answer_last = bool(answer_last)

    def __call__(self, solution_str: str, ground_truth: Any, extra_info: Any = None) -> dict[str, float]:
        result = self.scorer(solution_str, ground_truth, extra_info)
        judged = dict(result) if isinstance(result, Mapping) else {"score": result}
        missing = {"score", "lenient", "format"} - judged.keys()
        if missing:
            raise ValueError(f"RightAnswerReward: its scorer returned {sorted(judged)}, without {sorted(missing)}; "
                             "wrap a scorer of bare answers in FinalAnswerScorer")
        ends = answer_ends_reply(solution_str)
        right = _full_credit(judged["score"])  # right in the form (no final answer scores 0)
        went_on = self.answer_last and not ends  # answered, then kept writing
        # the form is read first: a wrong final answer earns nothing, whatever number comes after it
        unformatted = (right and went_on) or (judged["format"] == 0.0 and _full_credit(judged["lenient"]))
        reward = 1.0 if right and not went_on else self.unformatted_credit if unformatted else 0.0
        return {**judged, "score": reward, "strict": 1.0 if right else 0.0, "answer_last": 1.0 if ends else 0.0,
                "lenient": 1.0 if _full_credit(judged["lenient"]) else 0.0,
                "task_partial": 1.0 if 0.0 < judged["score"] < 1.0 else 0.0,
                "partial": 1.0 if unformatted else 0.0}

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, RightAnswerReward) and other.scorer == self.scorer
                and other.unformatted_credit == self.unformatted_credit and other.answer_last == self.answer_last)

    def __hash__(self) -> int:
        return hash((RightAnswerReward, self.scorer, self.unformatted_credit, self.answer_last))

    def __repr__(self) -> str:
        return (f"RightAnswerReward({self.scorer!r}, unformatted_credit={self.unformatted_credit}, "
                f"answer_last={self.answer_last})")
