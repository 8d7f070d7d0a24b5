"""The rule rewards of every data_source the project knows, in one table.

Each data_source names two things that must agree: the scorer of a response (what RL trains on
and evaluation reports) and the answer extractor of majority voting (maj@k: which responses give
the same answer). Keeping both in one row means adding a task, or a source name, is one line,
and the two can never list different sources. Everything else looks them up here, by the
data_source name each row carries: `default_scorers()` for `RewardManager`, `EXTRACTORS` (the
default of `EvalJob.extractors`) for majority voting.

A key ending in "*" names a family of sources: "reasoning_gym/*" judges "reasoning_gym/leg_counting" and
every other task of reasoning-gym (each row's `extra_info` names its task). `rule_key` is the one lookup
every table user goes through (the exact name first, then the longest family covering it), so a scorer
table given to `RewardManager` may hold families too ("myorg/*": my_score).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable, Mapping
from typing import Any, NoReturn

from rlhf.rewards.arithmetic import arithmetic_answer, exact_match_score
from rlhf.rewards.code import code_score
from rlhf.rewards.countdown import countdown_score
from rlhf.rewards.direct_answer import direct_answer_score
from rlhf.rewards.gsm8k import gsm8k_answer, gsm8k_score
from rlhf.rewards.final_answer import final_answer
from rlhf.rewards.math import MATH_SOURCES, math_answer, math_score
from rlhf.rewards.reasoning_gym import SOURCE_PREFIX, reasoning_gym_score

Scorer = Callable[..., "float | dict"]
Extractor = Callable[[str], "Hashable | None"]

CODE_SOURCES = ("codecontests", "apps", "codeforces", "taco")
"""verl's "prime code" sources: stdin/stdout test cases, run in the code sandbox."""


class FrozenDict(dict):
    """A dict that refuses changes: a table that is also a default argument, shared by every caller
    (a plain dict, so graphs hash it and Ray pickles it; copy it with `dict(...)` to change it)."""

    def _refuse(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError("this table is read-only (it is a shared default); copy it with dict(...) and change the copy")

    __setitem__ = __delitem__ = __ior__ = clear = pop = popitem = setdefault = update = _refuse

    def __reduce__(self) -> tuple:
        return (type(self), (dict(self),))


FAMILY = "*"
"""A table key ending in FAMILY covers every data_source that starts with the rest of the key."""


def rule_key(table: Mapping[str, Any], source: str) -> str | None:
    """The key of `table` that judges data_source `source`: `source` itself if present, else the longest
    family key ("reasoning_gym/*") whose prefix starts `source`; None when no key covers it."""
    if source in table:
        return source
    families = [key for key in table if key.endswith(FAMILY) and source.startswith(key[: -len(FAMILY)])]
    return max(families, key=len, default=None)


@dataclasses.dataclass(frozen=True)
class SourceRules:
    """How one data_source's responses are judged."""

    score: Scorer  # score(response, ground_truth, extra_info) -> float | dict
    answer: Extractor | None = None  # response -> its final answer for maj@k; None: no maj@k for this source


RULES: FrozenDict = FrozenDict({
    "arithmetic": SourceRules(exact_match_score, arithmetic_answer),
    "countdown": SourceRules(countdown_score),  # an equation per response: no shared answer to vote on
    "direct_answer": SourceRules(direct_answer_score),  # style (opens with its subject): nothing to vote on
    "openai/gsm8k": SourceRules(gsm8k_score, gsm8k_answer),
    **{source: SourceRules(math_score, math_answer) for source in MATH_SOURCES},
    **{source: SourceRules(code_score) for source in CODE_SOURCES},  # a program: no shared answer either
    SOURCE_PREFIX + FAMILY: SourceRules(reasoning_gym_score, final_answer),  # every reasoning-gym task
})
"""data_source -> its scorer and answer extractor (read-only)."""

SCORERS: FrozenDict = FrozenDict({source: rules.score for source, rules in RULES.items()})
"""data_source -> scorer, for every source in `RULES` (read-only; `default_scorers()` gives a copy)."""

EXTRACTORS: FrozenDict = FrozenDict({source: rules.answer for source, rules in RULES.items() if rules.answer})
"""data_source -> maj@k answer extractor, for the sources in `RULES` that have one (read-only; the default
of `EvalJob.extractors`; `default_extractors()` gives a copy)."""


def default_scorers() -> dict[str, Scorer]:
    """The scorer of each data_source in `RULES` (what our generators and verl's preprocessing write).

    A fresh dict each call: copy, extend or override it and pass it to `RewardManager`.
    """
    return dict(SCORERS)


def scorers_with(overrides: dict[str, Scorer] | None = None, builtin: bool = True) -> dict[str, Scorer]:
    """`default_scorers()` (or nothing, when not `builtin`) with `overrides` (data_source -> scorer) on top:
    the scorers of `rlhf eval --scorer SOURCE=module:function`."""
    return {**(default_scorers() if builtin else {}), **(overrides or {})}


def default_extractors() -> dict[str, Extractor]:
    """The maj@k answer extractor of each data_source in `RULES` that has one (the others get no
    maj@k). A fresh dict each call: extend or override it and pass it to `EvalJob`."""
    return dict(EXTRACTORS)
