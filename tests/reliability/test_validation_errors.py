"""Validation counts the failures of every reward it scores with, the auxiliary ones included: a
scorer that fails on every row must not read as 64 rows that scored 0.0 with 0.0 errors."""

import pytest

from helpers import group_plan, tiny_model_path
from rlhf.data.generators import arithmetic_rows
from rlhf.data.prompts import PromptDataset
from rlhf.models.loading import load_tokenizer
from rlhf.rewards.arithmetic import exact_match_score
from rlhf.rewards.manager import RewardManager
from rlhf.rollout.sampling import SamplingParams
from rlhf.runtime.local import LocalRuntime
from rlhf.trainers.evaluate import Evaluator


@pytest.fixture(scope="module")
def policy():
    runtime = LocalRuntime()
    yield runtime.start_groups(group_plan(1))["policy"]
    runtime.shutdown()


def always_fails(text, truth, extra=None):
    raise ValueError("the judge is down")


def test_an_auxiliary_reward_that_fails_on_every_row_is_counted(policy, caplog):
    data = PromptDataset(arithmetic_rows(6, split="test"), load_tokenizer(tiny_model_path()))
    main = RewardManager({"arithmetic": exact_match_score})
    judge = RewardManager({"arithmetic": always_fails}, strict=False)
    with caplog.at_level("WARNING", logger="rlhf.rewards.manager"):
        metrics = Evaluator(data, main, SamplingParams(n=2, temperature=1.0, max_new_tokens=4), prompts_per_call=4,
                            aux_rewards={"judge": judge})(policy)  # two calls: 4 prompts, then 2
    assert metrics["val-aux/arithmetic/judge/mean@2"] == 0.0  # the fallback score of every row
    assert metrics["val-aux/judge/reward/errors"] == 12  # 6 prompts x 2 responses, over both calls
    assert metrics["val-aux/judge/reward/errors/arithmetic"] == 12
    assert metrics["val-aux/reward/errors"] == 0  # the main reward had none
    assert "reward scorer failure" in caplog.text
