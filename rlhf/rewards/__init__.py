"""Rule rewards: one plain scoring function per task, and a manager that dispatches by data_source.

A scorer is `score(solution_str, ground_truth, extra_info=None, **options) -> float | dict`;
options are bound with `functools.partial` (or `fdl.Partial` in a graph), never by name.
`RewardManager` scores in-process or in a pool of worker processes with timeouts, takes
batched scorers (`Batched`) and DAPO overlong shaping; `CombinedReward` sums weighted rewards;
`code_score` runs a response's program against test cases in a sandbox (`rlhf.rewards.sandbox`).
`RULES` (rlhf.rewards.registry) is the one table of each data_source's scorer and maj@k answer
extractor; `default_scorers()` and `default_extractors()` read it. `FinalAnswerScorer` scores free-form
responses by their "Answer: ..." line; `reasoning_gym_score` does so with reasoning-gym's task scorers.
"""

from rlhf.rewards.arithmetic import arithmetic_answer, digit_match_score, exact_match_score
from rlhf.rewards.code import code_score
from rlhf.rewards.combined import CombinedReward
from rlhf.rewards.countdown import countdown_score
from rlhf.rewards.final_answer import FinalAnswerScorer, LenientScorer, final_answer, lenient_answers
from rlhf.rewards.gsm8k import gsm8k_answer, gsm8k_flexible, gsm8k_score, gsm8k_strict
from rlhf.rewards.manager import (
    Batched,
    Reward,
    RewardManager,
    RewardOutput,
    ScorerError,
    UnknownDataSourceError,
)
from rlhf.rewards.math import is_equivalent, last_boxed, math_answer, math_score
from rlhf.rewards.pool import WorkerPoolError
from rlhf.rewards.reasoning_gym import reasoning_gym_lenient_score, reasoning_gym_score
from rlhf.rewards.registry import (
    EXTRACTORS,
    RULES,
    SCORERS,
    SourceRules,
    default_extractors,
    default_scorers,
    rule_key,
    scorers_with,
)
from rlhf.rewards.sandbox import SandboxError


__all__ = [
    "EXTRACTORS",
    "RULES",
    "SCORERS",
    "SourceRules",
    "arithmetic_answer",
    "default_extractors",
    "gsm8k_answer",
    "math_answer",
    "Batched",
    "CombinedReward",
    "FinalAnswerScorer",
    "LenientScorer",
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
    "scorers_with",
    "exact_match_score",
    "digit_match_score",
    "final_answer",
    "lenient_answers",
    "reasoning_gym_lenient_score",
    "reasoning_gym_score",
    "rule_key",
    "gsm8k_flexible",
    "gsm8k_score",
    "gsm8k_strict",
    "is_equivalent",
    "last_boxed",
    "math_score",
]
