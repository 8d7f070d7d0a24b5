"""The trainer's validation: greedy and sampled, with pass@k / maj@k, on the tiny model in-process."""

import pytest

from rlhf.data.generators import arithmetic_rows
from rlhf.data.prompts import PromptDataset
from rlhf.models.loading import load_tokenizer
from rlhf.rewards.arithmetic import exact_match_score
from rlhf.rewards.manager import RewardManager
from rlhf.rollout.sampling import SamplingParams
from rlhf.runtime.local import LocalRuntime
from rlhf.trainers.evaluate import Evaluator
from helpers import group_plan, tiny_model_path


@pytest.fixture(scope="module")
def policy():
    runtime = LocalRuntime()
    yield runtime.start_groups(group_plan(1))["policy"]
    runtime.shutdown()


def evaluator(sampling, **kw):
    data = PromptDataset(arithmetic_rows(6, split="test"), load_tokenizer(tiny_model_path()))
    reward = RewardManager({"arithmetic": exact_match_score})
    always = RewardManager({"arithmetic": lambda text, truth, extra=None: 1.0})
    return Evaluator(data, reward, sampling, prompts_per_call=4, aux_rewards={"always": always}, **kw)


def test_greedy_validation_reports_mean_at_1(policy):
    metrics = evaluator(SamplingParams(temperature=0.0, max_new_tokens=4))(policy)
    assert 0.0 <= metrics["val-core/arithmetic/reward/mean@1"] <= 1.0
    assert metrics["val-aux/arithmetic/always/mean@1"] == 1.0
    assert "val-core/arithmetic/reward/pass@1" in metrics


def test_sampled_validation_reports_pass_maj_best_with_intervals(policy):
    metrics = evaluator(SamplingParams(n=4, temperature=1.0, max_new_tokens=4), n_boot=50)(policy)
    for k in (1, 2, 4):
        assert f"val-core/arithmetic/reward/pass@{k}" in metrics
    assert metrics["val-core/arithmetic/reward/pass@4"] >= metrics["val-core/arithmetic/reward/pass@1"]
    assert "val-core/arithmetic/reward/maj@4/mean" in metrics and "val-aux/arithmetic/reward/maj@2/mean" in metrics
    low, high = metrics["val-aux/arithmetic/reward/pass@4/ci_low"], metrics["val-aux/arithmetic/reward/pass@4/ci_high"]
    assert low <= metrics["val-core/arithmetic/reward/pass@4"] <= high
