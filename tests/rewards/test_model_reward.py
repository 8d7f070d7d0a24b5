"""mix_model_scores: rule and reward-model scores summed by weight, on each response's last token."""

import pytest
import torch

from rlhf.rewards.model_reward import mix_model_scores, place_on_last_token


def test_mixing_weights_rule_and_model_scores():
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])
    rule = torch.tensor([1.0, 0.0, 1.0])
    out, metrics = mix_model_scores(rule, torch.tensor([0.5, -2.0, 3.0]), mask, model_weight=0.5, rule_weight=2.0)
    # 2*1 + 0.5*0.5 = 2.25;  2*0 + 0.5*-2 = -1;  2*1 + 0.5*3 = 3.5
    torch.testing.assert_close(out["scores"], torch.tensor([2.25, -1.0, 3.5]))
    torch.testing.assert_close(out["token_level_scores"], torch.tensor([[0, 2.25, 0], [-1.0, 0, 0], [0, 0, 0]]))
    assert out["reward_extra/model/score"].tolist() == [0.5, -2.0, 3.0]
    assert metrics == {"reward/rule/mean": pytest.approx(2 / 3), "reward/model/mean": pytest.approx(0.5)}
    assert out["reward_extra/rule/score"].tolist() == [1.0, 0.0, 1.0]
    with pytest.raises(ValueError, match="2 reward-model scores for 3 rows"):
        mix_model_scores(rule, torch.zeros(2), mask)
    with pytest.raises(FloatingPointError):
        mix_model_scores(rule, torch.tensor([0.0, float("nan"), 0.0]), mask)


def test_without_a_rule_the_score_is_the_weighted_model_score():
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    out, metrics = mix_model_scores(None, torch.tensor([0.5, -2.0]), mask, model_weight=2.0, rule_weight=7.0)
    torch.testing.assert_close(out["scores"], torch.tensor([1.0, -4.0]))  # 2 x 0.5; 2 x -2 (rule_weight unused)
    torch.testing.assert_close(out["token_level_scores"], torch.tensor([[0, 1.0, 0], [-4.0, 0, 0]]))
    assert "reward_extra/rule/score" not in out and metrics == {"reward/model/mean": pytest.approx(-0.75)}
