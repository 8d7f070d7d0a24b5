"""What each advantage estimator needs from the rest of an RL setup, in one table.

The RL trainer reads it (to refuse a setup when it is built, and to know which inputs to
compute at each step) and so does preflight (`rlhf.runtime.preflight`, before anything starts),
so the two can never disagree about, say, which estimators need several samples per prompt.

    needs = estimator_needs(GRPO)           # or an instance: estimator_needs(GRPO())
    needs.min_samples                       # 2: a group baseline needs two samples per prompt
    setup_problems(GRPO, n=1, has_critic=False)   # [Problem(field="sampling.n", ...)]

A user-defined estimator states its needs with a class attribute `needs = EstimatorNeeds(...)` (an
instance may hold its own, e.g. one that wraps another estimator and adds that one's needs to its own);
without one, only the historical `requires_critic` attribute is read.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from rlhf.algos.advantages import (
    GAE,
    GPG,
    GRPO,
    OPO,
    RLOO,
    GRPOPassK,
    OptimalTokenBaseline,
    ReinforcePlusPlus,
    ReinforcePlusPlusBaseline,
    ReMax,
)


@dataclasses.dataclass(frozen=True)
class EstimatorNeeds:
    """Inputs an estimator needs beyond rewards and the response mask."""

    min_samples: int = 1  # samples per prompt: a baseline made of the other samples needs 2
    critic: bool = False  # values V(s_t) from a critic group (`AdvantageInputs.values`)
    baseline_rollout: bool = False  # the score of a greedy response per prompt (`baseline_rewards`)
    token_statistics: bool = False  # old_log_probs and sum_pi_squared from the policy worker's logits
    old_log_probs: bool = False  # log pi_old(y_t) of the sampled tokens, even when the update is on-policy
    teacher_log_probs: bool = False  # log pi_teacher(y_t) from the policy worker's teacher (on-policy distillation)


GROUP = EstimatorNeeds(min_samples=2)

NEEDS: dict[type, EstimatorNeeds] = {
    GAE: EstimatorNeeds(critic=True),
    GRPO: GROUP,
    GRPOPassK: GROUP,
    RLOO: GROUP,
    OPO: GROUP,
    GPG: GROUP,
    ReinforcePlusPlusBaseline: GROUP,
    ReinforcePlusPlus: EstimatorNeeds(),
    ReMax: EstimatorNeeds(baseline_rollout=True),
    OptimalTokenBaseline: EstimatorNeeds(min_samples=2, token_statistics=True),
}


def _class(estimator: Any) -> type:
    return estimator if isinstance(estimator, type) else type(estimator)


def estimator_needs(estimator: Any) -> EstimatorNeeds:
    """The needs of an estimator class or instance (an instance's own `needs`, else its class's, else the
    nearest base class in `NEEDS`)."""
    cls = _class(estimator)
    declared = getattr(estimator, "needs", None)
    if isinstance(declared, EstimatorNeeds):
        return declared
    for klass in cls.__mro__:
        if klass in NEEDS:
            return NEEDS[klass]
    return EstimatorNeeds(critic=bool(getattr(cls, "requires_critic", False)))


@dataclasses.dataclass(frozen=True)
class Problem:
    """A setup that cannot work. field: the RLTrainer argument at fault (a dotted path below it);
    fix: one `path=value` below the trainer that repairs it (for a `--config set:` hint), or ""."""

    field: str
    message: str
    fix: str = ""


def setup_problems(
    estimator: Any,
    *,
    n: int | None,  # samples per prompt (SamplingParams.n); None: unknown, not checked
    has_critic: bool,
    dynamic_sampling: bool = False,  # DAPO's filter keeps groups whose rewards differ
) -> list[Problem]:
    """Everything wrong with running `estimator` in this setup (empty when it can run)."""
    needs, name = estimator_needs(estimator), _class(estimator).__name__
    problems = []
    if n is not None and n < needs.min_samples:
        problems.append(Problem(
            "sampling.n",
            f"{name} compares the samples of each prompt, and n={n} gives groups of one sample: every advantage "
            f"is 0 and nothing is learned. Set n >= {needs.min_samples} (verl's rollout.n), or use a single-sample "
            "estimator (ReinforcePlusPlus, ReMax).",
            fix="sampling.n=8",
        ))
    if dynamic_sampling and n is not None and n < 2:
        problems.append(Problem(
            "sampling.n",
            f"dynamic sampling keeps the prompts whose samples got different rewards, and n={n} gives one sample "
            "per prompt: no prompt would ever be kept. Set n >= 2 or turn dynamic_sampling off.",
            fix="sampling.n=8",
        ))
    if needs.critic and not has_critic:
        problems.append(Problem(
            "advantage",
            f"{name} needs a critic (values), but there is no critic group. Add one (see "
            "rlhf_configs.algorithms.use_gae_with_critic, experiments/qwen_gsm8k_ppo.py) or use a critic-free "
            "estimator: gin `RLTrainer.advantage = @rlhf.algos.GRPO()` (or RLOO, ReinforcePlusPlus).",
        ))
    return problems


def reference_problems(*, kl_loss: bool, kl_in_reward: bool, has_ref: bool) -> list[Problem]:
    """A KL term (a loss, or a penalty in the reward) needs the frozen reference policy."""
    if has_ref:
        return []
    out = []
    if kl_loss:
        out.append(Problem(
            "policy.worker.ref_model_path",
            "the objective has a KL loss against a reference policy, but ref_model_path is None. Set it (usually "
            "the initial model), or drop the KL loss.",
            fix="policy.worker.objective.kl_loss=None",
        ))
    if kl_in_reward:
        out.append(Problem(
            "policy.worker.ref_model_path",
            "kl_in_reward puts a KL penalty against a reference policy in the reward, but ref_model_path is None. "
            "Set it (usually the initial model), or turn the penalty off.",
            fix="kl_in_reward=None",
        ))
    return out


def teacher_problems(estimator: Any, *, has_teacher: bool | None) -> list[Problem]:
    """An estimator that scores samples against a teacher (on-policy distillation) needs the policy worker's
    teacher model. `has_teacher`: whether the policy worker has one (None: unknown, not checked)."""
    if has_teacher is not False or not estimator_needs(estimator).teacher_log_probs:
        return []
    return [Problem(
        "policy.worker.teacher_model_path",
        f"{_class(estimator).__name__} trains the policy toward a teacher's log-probs, but the policy worker has no "
        "teacher. Set policy.worker.teacher_model_path to the teacher's model folder (its tokenizer must be the "
        "policy's; see docs/distillation.md), or use a task-reward estimator (GRPO).",
    )]


def staleness_problems(*, stale_samples: bool, rollout_correction: bool, decoupled: bool) -> list[Problem]:
    """Samples from an older policy (asynchronous rollout) need the behaviour policy's log-probs in the loss:
    a rollout correction on the trainer (bypass: PPO's ratio against the behaviour policy) or the decoupled
    objective (`PolicyObjective.decoupled`)."""
    if not stale_samples or rollout_correction or decoupled:
        return []
    return [Problem(
        "rollout_correction",
        "async_rollout trains on samples up to max_staleness versions old, and neither the trainer "
        "(rollout_correction) nor the objective (policy.worker.objective.decoupled) corrects for the policy that "
        "sampled them. Set rollout_correction=RolloutCorrection(bypass=True) (PPO's ratio against the behaviour "
        "policy: what fiddler:one_step_off and fiddler:streaming set) or the objective's DecoupledPPO() (AReaL's).",
    )]
