"""reasoning-gym's tasks as rewards: each task's own scorer, applied to the response's final answer.

reasoning-gym (an optional dependency: the `tasks` extra) generates ~100 procedural tasks offline, each
with a scorer `dataset.score_answer(answer, entry)` in [0, 1]. Its scorers judge a bare answer, so
`reasoning_gym_score` first reads the final answer the prompt asked for (`final_answer`: a last line
"Answer: ..."), and reports what a format-blind reader would have scored as "lenient".

A row of task T carries data_source "reasoning_gym/T" and, in `extra_info`, what T's scorer needs to
re-score it: `task`, `question` and `metadata_json` (the entry's metadata as JSON text, which survives
parquet unchanged where a nested dict would not: parquet fills the keys other rows have with None).
A task without a single answer (propositional_logic accepts any valid conclusion) has the ground truth "".
This module is also where reasoning-gym is imported (on first use) and task names are checked.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
from typing import Any

from rlhf.rewards.final_answer import FinalAnswerScorer, LenientScorer

SOURCE_PREFIX = "reasoning_gym/"
"""data_source of task T: SOURCE_PREFIX + T."""

INSTALL = "pip install -c constraints.txt -e '.[tasks]'  (or: pip install reasoning-gym==0.1.25)"
"""How to install reasoning-gym, for error messages."""


def _reasoning_gym() -> Any:
    """The reasoning_gym module, imported on first use (1.4 s, and optional)."""
    try:
        import reasoning_gym
    except ImportError as err:
        raise ImportError(
            f"reasoning-gym is not installed; the reasoning_gym/<task> data and rewards need it. Fix: {INSTALL}"
        ) from err
    return reasoning_gym


def task_names() -> list[str]:
    """Every task reasoning-gym can generate, sorted."""
    return sorted(_reasoning_gym().factory.DATASETS)


def check_task(task: str) -> None:
    """Raise a ValueError listing the valid tasks (with a did-you-mean) unless `task` is one."""
    names = task_names()
    if task in names:
        return
    close = difflib.get_close_matches(task, names, n=1, cutoff=0.6)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise ValueError(f"reasoning_gym has no task {task!r}.{hint} Valid tasks ({len(names)}): {', '.join(names)}")


def difficulty_names(task: str) -> list[str]:
    """The settings of `task`'s generator (its config's fields, less `seed` and `size`)."""
    check_task(task)
    config = _reasoning_gym().factory.DATASETS[task][1]
    return [f.name for f in dataclasses.fields(config) if f.name not in ("seed", "size")]


def task_dataset(task: str, size: int, seed: int, **difficulty: Any) -> Any:
    """reasoning-gym's dataset of `task` (`size` entries from generator seed `seed`), with the difficulty
    settings checked: an unknown or invalid one is a ValueError that lists the valid ones."""
    settings = difficulty_names(task)
    unknown = sorted(set(difficulty) - set(settings))
    if unknown:
        raise ValueError(f"reasoning_gym/{task} has no setting {', '.join(map(repr, unknown))}; "
                         f"its settings: {', '.join(settings) or 'none'}")
    try:
        return _reasoning_gym().create_dataset(task, size=size, seed=seed, **difficulty)
    except (AssertionError, TypeError, ValueError) as err:  # reasoning-gym validates configs with assert
        raise ValueError(f"reasoning_gym/{task}: invalid settings {difficulty}: {err or type(err).__name__}. "
                         f"Its settings: {', '.join(settings)}") from err


def _tagged(value: Any) -> Any:
    """`value` with tuples and sets tagged (JSON has only lists), anything else unknown as its str."""
    if isinstance(value, dict):
        return {str(key): _tagged(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_tagged(item) for item in value]
    if isinstance(value, tuple):
        return {_TUPLE: [_tagged(item) for item in value]}
    if isinstance(value, (set, frozenset)):
        return {_SET: sorted((_tagged(item) for item in value), key=str)}
    return value if value is None or isinstance(value, (str, int, float, bool)) else str(value)


def _untagged(value: Any) -> Any:
    if isinstance(value, list):
        return [_untagged(item) for item in value]
    if not isinstance(value, dict):
        return value
    if len(value) == 1 and _TUPLE in value:
        return tuple(_untagged(item) for item in value[_TUPLE])
    if len(value) == 1 and _SET in value:
        return {_untagged(item) for item in value[_SET]}
    return {key: _untagged(item) for key, item in value.items()}


_TUPLE, _SET = "__tuple__", "__set__"


def metadata_json(metadata: Any) -> str:
    """An entry's metadata as JSON text that `metadata_from_json` turns back into equal Python values: tuples
    and sets are tagged (scorers compare them: arc_agi's grids are tuples), anything else unknown is its str."""
    return json.dumps(_tagged(metadata))


def metadata_from_json(text: str) -> Any:
    """The metadata `metadata_json` wrote."""
    return _untagged(json.loads(text))


@functools.cache
def _scoring_dataset(task: str) -> Any:
    """One dataset object per task and process, only for its `score_answer` (entries carry the rest)."""
    return task_dataset(task, size=1, seed=0)


def task_answer_score(answer: str, ground_truth: Any, extra_info: dict) -> float:
    """The task's own `score_answer` of a bare `answer`, for the row that `extra_info` describes."""
    missing = [key for key in ("task", "question", "metadata_json") if key not in (extra_info or {})]
    if missing:
        raise ValueError(
            f"reasoning_gym scorer: extra_info lacks {', '.join(missing)} (has {sorted(extra_info or {})}). "
            "Fix: make the rows with rlhf.data.reasoning_gym.reasoning_gym_rows or `rlhf data prepare reasoning_gym/T`."
        )
    truth = str(ground_truth)
    entry = {"question": extra_info["question"], "answer": truth if truth else None,  # "": no single answer
             "metadata": metadata_from_json(extra_info["metadata_json"])}
    try:
        return float(_scoring_dataset(extra_info["task"]).score_answer(answer, entry))
    except Exception:  # noqa: BLE001 - some tasks' scorers raise on what they cannot parse (prime_factorization: int())
        return 0.0


_SCORER = FinalAnswerScorer(task_answer_score)


def reasoning_gym_score(solution_str: str, ground_truth: Any, extra_info: dict) -> dict[str, float]:
    """The reward of data_source "reasoning_gym/T": {"score": T's score of the final answer ("Answer: ...",
    else the last \\boxed{}), 0 without one; "lenient": the best score over `lenient_answers`; "format": 1/0;
    "partial": 1 where the score is partial credit} (`FinalAnswerScorer`)."""
    return _SCORER(solution_str, ground_truth, extra_info)


_LENIENT = LenientScorer(task_answer_score)


def reasoning_gym_lenient_score(solution_str: str, ground_truth: Any, extra_info: dict) -> float:
    """`reasoning_gym_score`'s "lenient" value as a score: for a held-out evaluator's aux reward, beside the
    strict one (`scorers={"reasoning_gym/*": reasoning_gym_lenient_score}`)."""
    return _LENIENT(solution_str, ground_truth, extra_info)
