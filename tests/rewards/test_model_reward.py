"""mix_model_scores: rule and reward-model scores summed by weight, on each response's last token."""

import pytest
import torch

from rlhf.batch import Batch
from rlhf.rewards.model_reward import mix_model_scores, place_on_last_token


def test_mixing_weights_rule_and_model_scores():
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])
    rule = torch.tensor([1.0, 0.0, 1.0])
    scored = Batch({"scores": rule, "token_level_scores": place_on_last_token(rule, mask)})
    out, metrics = mix_model_scores(scored, torch.tensor([0.5, -2.0, 3.0]), mask, model_weight=0.5, rule_weight=2.0)
    # 2*1 + 0.5*0.5 = 2.25;  2*0 + 0.5*-2 = -1;  2*1 + 0.5*3 = 3.5
    torch.testing.assert_close(out["scores"], torch.tensor([2.25, -1.0, 3.5]))
    torch.testing.assert_close(out["token_level_scores"], torch.tensor([[0, 2.25, 0], [-1.0, 0, 0], [0, 0, 0]]))
    assert out["reward_extra/model/score"].tolist() == [0.5, -2.0, 3.0]
    assert metrics == {"reward/rule/mean": pytest.approx(2 / 3), "reward/model/mean": pytest.approx(0.5)}
    with pytest.raises(ValueError, match="2 reward-model scores for 3 rows"):
        mix_model_scores(scored, torch.zeros(2), mask)
    with pytest.raises(FloatingPointError):
        mix_model_scores(scored, torch.tensor([0.0, float("nan"), 0.0]), mask)
