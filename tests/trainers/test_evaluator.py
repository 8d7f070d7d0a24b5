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
    # how spread out the answers are, against the right answers' own spread (6 rows)
    assert 1 / 6 <= metrics["val-aux/arithmetic/answers/top_share"] <= 1.0
    top, distinct = metrics["val-aux/arithmetic/answers/top_share"], metrics["val-aux/arithmetic/answers/distinct"]
    assert top + distinct <= 7 / 6 + 1e-9  # k distinct answers of 6: the most common one is at most 6 - (k - 1)
    truths = [r["reward_model"]["ground_truth"] for r in arithmetic_rows(6, split="test")]
    assert metrics["val-aux/arithmetic/answers/truth_top_share"] == max(map(truths.count, truths)) / 6


def test_sampled_validation_reports_pass_maj_best_with_intervals(policy):
    metrics = evaluator(SamplingParams(n=4, temperature=1.0, max_new_tokens=4), n_boot=50)(policy)
    for k in (1, 2, 4):
        assert f"val-core/arithmetic/reward/pass@{k}" in metrics
    assert metrics["val-core/arithmetic/reward/pass@4"] >= metrics["val-core/arithmetic/reward/pass@1"]
    assert "val-core/arithmetic/reward/maj@4/mean" in metrics and "val-aux/arithmetic/reward/maj@2/mean" in metrics
    low, high = metrics["val-aux/arithmetic/reward/pass@4/ci_low"], metrics["val-aux/arithmetic/reward/pass@4/ci_high"]
    assert low <= metrics["val-core/arithmetic/reward/pass@4"] <= high


def fails_on_odd_truths(text, truth, extra=None):
    """Raises for the prompts whose answer is odd; an extra value that is NaN for the others."""
    if int(truth) % 2:
        raise ValueError("cannot score this one")
    return {"score": 1.0, "confidence": float("nan")}


def test_validation_counts_reward_failures_and_non_finite_extras_as_training_does(policy, caplog):
    rows = arithmetic_rows(6, split="test")
    odd = sum(int(r["reward_model"]["ground_truth"]) % 2 for r in rows)
    assert 0 < odd < 6
    data = PromptDataset(rows, load_tokenizer(tiny_model_path()))
    reward = RewardManager({"arithmetic": fails_on_odd_truths}, strict=False)
    with caplog.at_level("WARNING", logger="rlhf.rewards.manager"):
        metrics = Evaluator(data, reward, SamplingParams(n=2, temperature=1.0, max_new_tokens=4),
                            prompts_per_call=4)(policy)  # two calls: 4 prompts, then 2
    assert metrics["val-aux/reward/errors"] == 2 * odd  # both responses of each odd prompt, over both calls
    assert metrics["val-aux/reward/errors/arithmetic"] == 2 * odd
    assert metrics["val-aux/reward/extra_nonfinite"] == 2 * (6 - odd)
    assert metrics["val-core/arithmetic/reward/mean@2"] == pytest.approx((6 - odd) / 6)  # failures score 0
    assert "reward scorer failure" in caplog.text and "non-finite extra values" in caplog.text


def test_reward_metrics_of_several_calls_add_counts_and_average_the_rest():
    from rlhf.trainers.evaluate import combine_reward_metrics

    calls = [({"reward/errors": 2.0, "reward/errors/a": 2.0, "reward/overlong_penalty/mean": -0.5}, 4),
             ({"reward/errors": 1.0, "reward/errors/b": 1.0, "reward/overlong_penalty/mean": 0.0}, 12)]
    assert combine_reward_metrics(calls) == {  # -0.5 * 4 / 16 + 0 * 12 / 16
        "reward/errors": 3.0, "reward/errors/a": 2.0, "reward/errors/b": 1.0, "reward/overlong_penalty/mean": -0.125}


def test_responses_at_the_budget_are_counted_per_source(policy):
    """A one-token budget: every response reaches it. And the count itself, on a rollout with two sources: a
    response is at the budget when the response part of its attention mask is as long as the budget."""
    import torch

    from rlhf.batch import Batch
    from rlhf.trainers.evaluate import budget_reached

    metrics = evaluator(SamplingParams(temperature=0.0, max_new_tokens=1))(policy)
    assert metrics["val-aux/arithmetic/response_length/clip_ratio"] == 1.0
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0]])  # prompts of 3, responses of 3
    rollout = Batch({"attention_mask": mask, "response_mask": torch.ones(3, 3, dtype=torch.long)},
                    {"data_source": ["a", "a", "b"]})
    assert budget_reached(rollout, 3) == [("a", False), ("a", True), ("b", False)]
    assert budget_reached(rollout, 2) == [("a", False), ("a", True), ("b", True)]
