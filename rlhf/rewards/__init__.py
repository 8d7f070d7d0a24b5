"""Rule rewards: one plain scoring function per task, and a manager that dispatches by data_source.

A scorer is `score(solution_str, ground_truth, extra_info=None, **options) -> float | dict`;
options are bound with `functools.partial` (or `fdl.Partial` in a graph), never by name.
`RewardManager` scores in-process or in a pool of worker processes with timeouts, takes
batched scorers (`Batched`) and DAPO overlong shaping; `CombinedReward` sums weighted rewards;
`code_score` runs a response's program against test cases in a sandbox (`rlhf.rewards.sandbox`).
"""

from collections.abc import Callable

from rlhf.rewards.arithmetic import digit_match_score, exact_match_score
from rlhf.rewards.code import code_score
from rlhf.rewards.combined import CombinedReward
from rlhf.rewards.countdown import countdown_score
from rlhf.rewards.gsm8k import gsm8k_flexible, gsm8k_score, gsm8k_strict
from rlhf.rewards.manager import (
    Batched,
    Reward,
    RewardManager,
    RewardOutput,
    ScorerError,
    UnknownDataSourceError,
)
from rlhf.rewards.math import is_equivalent, last_boxed, math_score
from rlhf.rewards.pool import WorkerPoolError
from rlhf.rewards.sandbox import SandboxError


def default_scorers() -> dict[str, Callable[..., float]]:
    """The scorer for each data_source our generators and verl's preprocessing scripts write.

    A fresh dict each call: copy, extend or override it and pass it to `RewardManager`.
    """
    return {
        "arithmetic": exact_match_score,
        "countdown": countdown_score,
        "openai/gsm8k": gsm8k_score,
        "lighteval/MATH": math_score,
        "DigitalLearningGmbH/MATH-lighteval": math_score,
        "HuggingFaceH4/MATH-500": math_score,
        # verl's "prime code" sources: stdin/stdout test cases, run in the code sandbox
        "codecontests": code_score,
        "apps": code_score,
        "codeforces": code_score,
        "taco": code_score,
    }


__all__ = [
    "Batched",
    "CombinedReward",
    "Reward",
    "RewardManager",
    "RewardOutput",
    "SandboxError",
    "ScorerError",
    "UnknownDataSourceError",
    "WorkerPoolError",
    "code_score",
    "countdown_score",
    "default_scorers",
    "exact_match_score",
    "digit_match_score",
    "gsm8k_flexible",
    "gsm8k_score",
    "gsm8k_strict",
    "is_equivalent",
    "last_boxed",
    "math_score",
]
