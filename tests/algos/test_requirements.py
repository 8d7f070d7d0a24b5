"""rlhf.algos.requirements: the one table of what each estimator needs."""

import pytest

from rlhf.algos import GRPO, ReinforcePlusPlus, ReMax
from rlhf.algos.requirements import NEEDS, EstimatorNeeds, estimator_needs, reference_problems, setup_problems


@pytest.mark.parametrize("estimator", list(NEEDS), ids=lambda c: c.__name__)
def test_the_table_agrees_with_the_estimators_own_critic_flag(estimator):
    assert estimator_needs(estimator).critic == estimator.requires_critic
    assert estimator_needs(estimator()) == estimator_needs(estimator)


def test_subclasses_and_user_estimators():
    class Mine(GRPO):
        pass

    class Declared:
        needs = EstimatorNeeds(min_samples=4)

    class Plain:
        requires_critic = True

    assert estimator_needs(Mine).min_samples == 2
    assert estimator_needs(Declared).min_samples == 4
    assert estimator_needs(Plain) == EstimatorNeeds(critic=True)


def test_setup_problems():
    assert [p.field for p in setup_problems(GRPO, n=1, has_critic=False)] == ["sampling.n"]
    assert setup_problems(GRPO, n=2, has_critic=False) == []
    assert setup_problems(GRPO, n=None, has_critic=False) == []  # unknown n: not checked
    assert setup_problems(ReinforcePlusPlus, n=1, has_critic=False) == []
    assert [p.field for p in setup_problems(ReMax, n=1, has_critic=False, dynamic_sampling=True)] == ["sampling.n"]
    assert estimator_needs(ReMax).baseline_rollout and not estimator_needs(GRPO).baseline_rollout


def test_reference_problems():
    assert reference_problems(kl_loss=True, kl_in_reward=True, has_ref=True) == []
    fixes = [p.fix for p in reference_problems(kl_loss=True, kl_in_reward=True, has_ref=False)]
    assert fixes == ["policy.worker.objective.kl_loss=None", "kl_in_reward=None"]
