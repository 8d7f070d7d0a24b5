"""rlhf.algos.reward_model_loss: the Bradley-Terry loss, hand-computed, its properties, and TRL's RewardTrainer."""

import math
import types

import pytest
import torch
from hypothesis import given, strategies as st

from rlhf.algos.pairs import split_pairs
from rlhf.algos.reward_model_loss import BradleyTerryLoss

from .trl_reference import trl_module

floats = st.floats(-20, 20, allow_nan=False)


def test_hand_computed():
    chosen = torch.tensor([2.0, 0.0], requires_grad=True)
    rejected = torch.tensor([1.0, 1.0])
    loss, m = BradleyTerryLoss()(chosen, rejected)
    # -log sigmoid(1) = log(1 + e^-1) = 0.313262; -log sigmoid(-1) = log(1 + e) = 1.313262; mean 0.813262
    assert loss.item() == pytest.approx(0.813262, abs=1e-6)
    assert m["accuracy"].item() == 0.5 and m["margin"].item() == 0.0
    assert m["chosen_mean"].item() == 1.0 and m["rejected_mean"].item() == 1.0
    loss.backward()
    # d/dr_c of -log sigmoid(d) / 2 = -sigmoid(-d) / 2: -0.268941 / 2 and -0.731059 / 2
    torch.testing.assert_close(chosen.grad, torch.tensor([-0.134471, -0.365529]), atol=1e-6, rtol=0)

    # margin 0.5 on the first pair: -log sigmoid(0.5) = 0.474077; (0.474077 + 1.313262) / 2 = 0.893670
    loss, _ = BradleyTerryLoss()(chosen, rejected, torch.tensor([0.5, 0.0]))
    assert loss.item() == pytest.approx(0.893670, abs=1e-6)
    # centring 0.01: sums (3, 1), squares (9, 1), mean 5, times 0.01 = 0.05 on top
    loss, m = BradleyTerryLoss(center_rewards_coefficient=0.01)(chosen, rejected)
    assert loss.item() == pytest.approx(0.813262 + 0.05, abs=1e-6)
    assert m["loss"].item() == pytest.approx(0.813262, abs=1e-6)  # the metric is the Bradley-Terry term alone


@given(st.lists(floats, min_size=2, max_size=8), floats, floats)
def test_loss_depends_on_the_difference_only_and_falls_as_it_grows(rewards, shift, extra):
    r = torch.tensor(rewards, dtype=torch.float64)
    chosen, rejected = r, r.flip(0)
    base, _ = BradleyTerryLoss()(chosen, rejected)
    shifted, _ = BradleyTerryLoss()(chosen + shift, rejected + shift)
    torch.testing.assert_close(base, shifted)  # no centring: rewards are defined up to an offset
    further, _ = BradleyTerryLoss()(chosen + abs(extra), rejected)
    assert further <= base + 1e-12
    # a margin m is the same as a difference smaller by m
    with_margin, _ = BradleyTerryLoss()(chosen, rejected, torch.full_like(r, extra))
    torch.testing.assert_close(with_margin, BradleyTerryLoss()(chosen - extra, rejected)[0])


@given(st.lists(floats, min_size=1, max_size=6), st.floats(0.001, 1.0))
def test_centring_pulls_the_offset_to_zero(rewards, coef):
    """Among all offsets of the same rewards, the centred loss is smallest where mean(r_c + r_r) = 0."""
    r = torch.tensor(rewards, dtype=torch.float64)
    chosen, rejected = r + 1.0, r
    offset = torch.zeros((), dtype=torch.float64, requires_grad=True)
    loss, _ = BradleyTerryLoss(center_rewards_coefficient=coef)(chosen + offset, rejected + offset)
    (grad,) = torch.autograd.grad(loss, offset)
    # d/do of c * mean((s + 2o)^2) at o = 0 is 4c * mean(s): zero exactly when the rewards are centred
    torch.testing.assert_close(grad, 4 * coef * (chosen + rejected).mean())


@given(st.lists(floats, min_size=4, max_size=8).filter(lambda x: len(x) % 2 == 0), st.floats(0, 0.1))
def test_micro_batches_with_the_global_pair_count_sum_to_the_batch_loss(rewards, coef):
    chosen = torch.tensor(rewards, dtype=torch.float64)
    rejected = chosen.roll(1)
    bt = BradleyTerryLoss(center_rewards_coefficient=coef or None)
    whole, _ = bt(chosen, rejected)
    half = len(chosen) // 2
    parts = [bt(chosen[s], rejected[s], num_pairs=len(chosen))[0] for s in (slice(0, half), slice(half, None))]
    torch.testing.assert_close(parts[0] + parts[1], whole)


def test_split_pairs_reads_the_interleaved_layout():
    chosen, rejected = split_pairs(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    assert chosen.tolist() == [1.0, 3.0] and rejected.tolist() == [2.0, 4.0]
    with pytest.raises(ValueError, match="odd number of rows: 3"):
        split_pairs(torch.zeros(3))


def test_invalid_coefficient_and_frozen():
    with pytest.raises(ValueError, match=">= 0"):
        BradleyTerryLoss(center_rewards_coefficient=-1.0)
    with pytest.raises(AttributeError, match="read-only"):
        BradleyTerryLoss().center_rewards_coefficient = 0.1


@pytest.mark.parametrize("margin, coef", [(False, None), (True, None), (True, 0.01), (False, 0.5)])
def test_equals_trls_reward_trainer(margin, coef):
    """TRL 1.16's `RewardTrainer.compute_loss`, run on fixed rewards (its model returns them as logits)."""
    reward_trainer = trl_module("trl.trainer.reward_trainer")
    chosen, rejected = torch.tensor([1.5, -0.2, 0.3]), torch.tensor([0.5, 0.7, 0.3])
    margins = torch.tensor([0.25, 1.0, 0.0])
    inputs = {"input_ids": torch.zeros(6, 2, dtype=torch.long), "attention_mask": torch.ones(6, 2, dtype=torch.long)}
    if margin:
        inputs["margin"] = margins
    logits = torch.cat([chosen, rejected])[:, None]  # TRL's batch: all chosen rows, then all rejected rows

    def model(**kwargs):
        return types.SimpleNamespace(logits=logits)

    identity = types.SimpleNamespace(gather_for_metrics=lambda x: x, gather=lambda x: x)
    trainer = types.SimpleNamespace(model=types.SimpleNamespace(training=False), accelerator=identity,
                                    args=types.SimpleNamespace(center_rewards_coefficient=coef),
                                    _metrics={"eval": __import__("collections").defaultdict(list)},
                                    _total_train_tokens=0, _tp_size=1)
    expected = reward_trainer.RewardTrainer.compute_loss(trainer, model, dict(inputs))
    ours, m = BradleyTerryLoss(center_rewards_coefficient=coef)(chosen, rejected, margins if margin else None)
    torch.testing.assert_close(ours, expected)
    assert m["accuracy"].item() == pytest.approx(trainer._metrics["eval"]["accuracy"][0])
    assert m["margin"].item() == pytest.approx(trainer._metrics["eval"]["margin"][0])
    assert math.isfinite(ours.item())
