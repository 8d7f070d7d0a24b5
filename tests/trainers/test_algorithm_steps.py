"""The RL trainer's algorithm steps on hand-built batches: DAPO's generation rounds, rollout
correction in place, and the policy objective applying the correction's weights."""

import math

import numpy as np
import pytest
import torch

from rlhf.algos import (
    DecoupledPPO,
    DynamicSamplingAccumulator,
    PPOClipLoss,
    RejectionMask,
    RolloutCorrection,
    TokenTIS,
    kl_k1,
    reduce_token,
)
from rlhf.batch import Batch
from rlhf.trainers.dynamic_sampling import collect_groups_with_variance, concat_rollouts
from rlhf.workers.objectives import PolicyObjective


def rollout(uids, scores, prompt_width, response_width, tag):
    """A scored rollout batch: prompt tokens = tag (left-padded by one), response tokens = tag + 100."""
    B, P, R = len(uids), prompt_width, response_width
    prompt_mask = torch.ones(B, P, dtype=torch.long)
    prompt_mask[:, 0] = 0
    prompts = torch.full((B, P), tag) * prompt_mask
    responses = torch.full((B, R), tag + 100)
    response_mask = torch.ones(B, R, dtype=torch.long)
    return Batch(
        {"prompts": prompts, "responses": responses, "response_mask": response_mask,
         "input_ids": torch.cat([prompts, responses], 1), "attention_mask": torch.cat([prompt_mask, response_mask], 1),
         "position_ids": torch.zeros(B, P + R, dtype=torch.long), "scores": torch.tensor(scores),
         "rollout_log_probs": torch.full((B, R), -1.0)},
        {"uid": np.array(uids, dtype=object)},
    )


def rounds(*batches):
    queue = list(batches)
    return lambda: queue.pop(0)


ROUND_1 = ("a", "a", "b", "b"), (1.0, 1.0, 0.0, 1.0)  # a: no spread, b: spread
ROUND_2 = ("c", "c", "a", "a"), (0.0, 0.5, 0.0, 0.0)  # c: spread; the prompt a again, still flat


def test_rounds_until_enough_groups_with_spread():
    batch, metrics = collect_groups_with_variance(
        rounds(rollout(*ROUND_1, 3, 2, 1), rollout(*ROUND_2, 4, 3, 2)),
        DynamicSamplingAccumulator(target_num_groups=2, max_attempts=5, concat=concat_rollouts),
    )
    assert list(batch["uid"]) == ["b", "b", "c@round1", "c@round1"]
    assert batch["scores"].tolist() == [0.0, 1.0, 0.0, 0.5]
    assert metrics == {"train/num_gen_batches": 2.0, "dynamic_sampling/groups_with_variance": 2.0,
                       "dynamic_sampling/filled_groups": 0.0}
    # widths differ (P 3 vs 4, R 2 vs 3): prompts left-aligned to P=4, responses start at column 4
    assert batch["input_ids"].shape == (4, 7)
    assert batch["input_ids"][:2].tolist() == [[0, 0, 1, 1, 101, 101, 0]] * 2
    assert batch["input_ids"][2:].tolist() == [[0, 2, 2, 2, 102, 102, 102]] * 2
    assert batch["response_mask"][:2].tolist() == [[1, 1, 0]] * 2
    assert torch.equal(batch["input_ids"][:, 4:], batch["responses"])


def test_when_the_rounds_run_out_the_batch_is_filled_with_flat_groups():
    batch, metrics = collect_groups_with_variance(
        rounds(rollout(*ROUND_1, 3, 2, 1), rollout(*ROUND_2, 3, 2, 2)),
        DynamicSamplingAccumulator(target_num_groups=3, max_attempts=2, concat=concat_rollouts),
    )
    assert list(batch["uid"]) == ["b", "b", "c@round1", "c@round1", "a", "a"]  # a: the first flat group
    assert metrics["train/num_gen_batches"] == 2 and metrics["dynamic_sampling/filled_groups"] == 1


def test_rollout_correction_rewrites_the_batch(tiny_trainer):
    trainer = tiny_trainer(rollout_correction=RolloutCorrection(
        is_weights=TokenTIS(threshold=2.0),
        rejections=[RejectionMask(estimator=kl_k1, reduce=reduce_token, lower=-math.log(4), upper=math.log(4))],
    ))
    batch = rollout(("a", "a"), (0.0, 1.0), 2, 3, 1)
    old = torch.full((2, 3), -1.0)
    # rho = pi_old / pi_rollout: token (0, 1) 1.5 (weight 1.5), (0, 2) e^2 ~ 7.4 (rejected: > 4), (1, 0) 3 (clipped to 2)
    batch["rollout_log_probs"] = old - torch.tensor([[0.0, math.log(1.5), 2.0], [math.log(3.0), 0.0, 0.0]])
    batch["old_log_probs"] = old
    metrics = trainer._correct_rollout(batch)
    assert batch["response_mask"].tolist() == [[1, 1, 0], [1, 1, 1]]
    torch.testing.assert_close(batch["rollout_is_weights"], torch.tensor([[1.0, 1.5, 0.0], [2.0, 1.0, 1.0]]))
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(1 / 6)
    assert metrics["rollout_corr/rollout_is_mean"] == pytest.approx((1 + 1.5 + 2 + 1 + 1) / 5)
    assert metrics["rollout_corr/kl"] == pytest.approx(-(math.log(1.5) + 2 + math.log(3)) / 6, rel=1e-5)


def test_bypass_mode_trains_against_the_engine_log_probs(tiny_trainer):
    trainer = tiny_trainer(rollout_correction=RolloutCorrection(bypass=True))
    batch = rollout(("a", "a"), (0.0, 1.0), 2, 3, 1)
    assert "old_log_probs" not in batch
    trainer._correct_rollout(batch)
    assert torch.equal(batch["old_log_probs"], batch["rollout_log_probs"])


def test_the_objective_applies_the_rollout_weights():
    objective = PolicyObjective(policy_loss=PPOClipLoss())
    log_probs = torch.tensor([[-1.0, -2.0]])
    batch = Batch({"response_mask": torch.ones(1, 2), "advantages": torch.tensor([[1.0, 3.0]])},
                  meta={"max_new_tokens": 2})  # what a rollout records
    # on-policy r = 1, so the per-token loss is -A: token mean (-1 - 3) / 2 = -2
    assert objective(log_probs, None, batch, num_tokens=2, num_seqs=1)[0].item() == pytest.approx(-2.0)
    batch["rollout_is_weights"] = torch.tensor([[2.0, 0.5]])  # (-1 * 2 - 3 * 0.5) / 2 = -1.75
    assert objective(log_probs, None, batch, num_tokens=2, num_seqs=1)[0].item() == pytest.approx(-1.75)


def test_the_decoupled_objective_weighs_each_token_by_its_behaviour_ratio():
    """On-policy (no old_log_probs) the proximal policy is the current one: w = exp(log_probs - rollout_log_probs)
    = [1.5, 0.5, 3 -> 0 above the cap 2]; the loss is the token mean of -w A r with r = 1, and its gradient
    on token t is -w_t A_t / 3 (the capped token still counts in the mean, as in AReaL)."""
    objective = PolicyObjective(policy_loss=PPOClipLoss(), decoupled=DecoupledPPO(behaviour_weight_cap=2.0))
    log_probs = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    rollout = log_probs.detach() - torch.log(torch.tensor([[1.5, 0.5, 3.0]]))
    batch = Batch({"response_mask": torch.ones(1, 3), "advantages": torch.tensor([[1.0, 2.0, 1.0]]),
                   "rollout_log_probs": rollout}, meta={"max_new_tokens": 3})
    loss, metrics = objective(log_probs, None, batch, num_tokens=3, num_seqs=1)
    assert loss.item() == pytest.approx(-(1.5 * 1 + 0.5 * 2) / 3)
    loss.backward()
    torch.testing.assert_close(log_probs.grad, torch.tensor([[-1.5 / 3, -1.0 / 3, 0.0]]))
    assert metrics["actor/behaviour_capped_fraction"].item() == pytest.approx(1 / 3)
    batch["rollout_is_weights"] = torch.ones(1, 3)  # a rollout correction too: two corrections of one thing
    with pytest.raises(ValueError, match="keep one of them"):
        objective(log_probs, None, batch, num_tokens=3, num_seqs=1)


@pytest.fixture
def tiny_trainer():
    from helpers import tiny_model_path
    from rlhf.algos import GRPO
    from rlhf.data.generators import arithmetic_rows
    from rlhf.data.prompts import PromptDataset
    from rlhf.models.loading import load_tokenizer
    from rlhf.rewards.arithmetic import exact_match_score
    from rlhf.rewards.manager import RewardManager
    from rlhf.trainers.rl import RLTrainer

    data = PromptDataset(arithmetic_rows(4), load_tokenizer(tiny_model_path()))
    return lambda **kw: RLTrainer(None, None, data, RewardManager({"arithmetic": exact_match_score}), advantage=GRPO(),
                                  **kw)
