"""rlhf.algos.preference: the DPO family, hand-computed, its properties, and TRL 1.16's DPO/CPO trainers."""

import collections
import math
import types

import pytest
import torch
from hypothesis import given, strategies as st

from rlhf.algos.preference import (
    DPOLoss,
    IPOLoss,
    PairLogProbs,
    RobustDPOLoss,
    RPOLoss,
    SimPOLoss,
    preference_metrics,
)

from .trl_reference import trl_module

# Two pairs. Pair 1: chosen -5 (ref -5.5), rejected -6 (ref -5.5): h = 0.5 - (-0.5) = 1.0.
# Pair 2: chosen -3 (ref -3), rejected -2 (ref -2.5): h = 0 - 0.5 = -0.5. With beta 0.1: z = (0.1, -0.05).
PAIRS = PairLogProbs(
    chosen=torch.tensor([-5.0, -3.0], dtype=torch.float64), rejected=torch.tensor([-6.0, -2.0], dtype=torch.float64),
    chosen_tokens=torch.tensor([2.0, 4.0], dtype=torch.float64),
    rejected_tokens=torch.tensor([4.0, 2.0], dtype=torch.float64),
    ref_chosen=torch.tensor([-5.5, -3.0], dtype=torch.float64),
    ref_rejected=torch.tensor([-5.5, -2.5], dtype=torch.float64),
)


def with_(pairs, **changes):
    return PairLogProbs(**{**vars(pairs), **changes})


@pytest.mark.parametrize("loss, expected", [
    # -log sigmoid(0.1) = log(1 + e^-0.1) = 0.644397; -log sigmoid(-0.05) = log(1 + e^0.05) = 0.718460
    (DPOLoss(beta=0.1), [0.644397, 0.718460]),
    # cDPO eps 0.1: 0.9 * 0.644397 + 0.1 * -log sigmoid(-0.1) (= 0.744397) = 0.654397; pair 2: 0.713460
    (DPOLoss(beta=0.1, label_smoothing=0.1), [0.654397, 0.713460]),
    # robust eps 0.1: (0.9 * 0.644397 - 0.1 * 0.744397) / 0.8 = 0.631897; pair 2: (0.9*0.718460 - 0.1*0.668460)/0.8
    (RobustDPOLoss(beta=0.1, label_smoothing=0.1), [0.631897, 0.724710]),
    # IPO per token: pair 1 h' = 0.5/2 - (-0.5)/4 = 0.375, pair 2 h' = 0/4 - 0.5/2 = -0.25; target 1/(2*0.1) = 5:
    # (0.375 - 5)^2 = 21.390625, (-0.25 - 5)^2 = 27.5625
    (IPOLoss(beta=0.1), [21.390625, 27.5625]),
    # IPO summed (the paper's form): (1 - 5)^2 = 16, (-0.5 - 5)^2 = 30.25
    (IPOLoss(beta=0.1, length_normalize=False), [16.0, 30.25]),
    # SimPO beta 2, gamma 1: r = 2 * logp / |y|: pair 1 r_c = -5, r_r = -3: -log sigmoid(-5 + 3 - 1) = 3.048587;
    # pair 2 r_c = -1.5, r_r = -2: -log sigmoid(-1.5 + 2 - 1) = 0.974077
    (SimPOLoss(beta=2.0, gamma=1.0), [3.048587, 0.974077]),
    # RPO alpha 1: DPO + NLL per token of chosen: 0.644397 + 5/2 = 3.144397; 0.718460 + 3/4 = 1.468460
    (RPOLoss(beta=0.1, alpha=1.0), [3.144397, 1.468460]),
])
def test_hand_computed(loss, expected):
    out = loss(PAIRS)
    torch.testing.assert_close(out.losses, torch.tensor(expected, dtype=torch.float64), atol=1e-6, rtol=0)


def test_rewards_and_metrics():
    out = DPOLoss(beta=0.1)(PAIRS)
    # r_c = 0.1 * (0.5, 0), r_r = 0.1 * (-0.5, 0.5)
    torch.testing.assert_close(out.chosen_rewards, torch.tensor([0.05, 0.0], dtype=torch.float64))
    torch.testing.assert_close(out.rejected_rewards, torch.tensor([-0.05, 0.05], dtype=torch.float64))
    m = preference_metrics(PAIRS, out)
    assert m["rewards/chosen"].item() == pytest.approx(0.025) and m["rewards/rejected"].item() == pytest.approx(0.0)
    assert m["rewards/margins"].item() == pytest.approx(0.025) and m["rewards/accuracies"].item() == 0.5
    assert m["logps/chosen"].item() == -4.0 and m["logps/rejected"].item() == -4.0
    assert m["loss"].item() == pytest.approx((0.644397 + 0.718460) / 2, abs=1e-6)
    simpo = SimPOLoss(beta=2.0, gamma=1.0)(PAIRS)  # reports its own reward, beta * mean log-prob
    torch.testing.assert_close(simpo.chosen_rewards, torch.tensor([-5.0, -1.5], dtype=torch.float64))


def test_margin_raises_the_bar_in_reward_units():
    margin = torch.tensor([0.5, 0.0], dtype=torch.float64)
    # pair 1: -log sigmoid(0.1 - 0.5) = 0.913015; pair 2 unchanged
    out = DPOLoss(beta=0.1)(with_(PAIRS, margin=margin))
    torch.testing.assert_close(out.losses, torch.tensor([0.913015, 0.718460], dtype=torch.float64), atol=1e-6, rtol=0)
    assert torch.equal(DPOLoss(beta=0.1, use_margin=False)(with_(PAIRS, margin=margin)).losses,
                       DPOLoss(beta=0.1)(PAIRS).losses)
    # IPO: the target gap beta * h' becomes 1/2 + m: (0.375 - (0.5 + 0.5) / 0.1)^2 = 92.640625
    assert IPOLoss(beta=0.1)(with_(PAIRS, margin=margin)).losses[0].item() == pytest.approx(92.640625)


def test_reference_free_and_missing_reference():
    no_ref = with_(PAIRS, ref_chosen=None, ref_rejected=None)
    assert not SimPOLoss.requires_reference and SimPOLoss()(no_ref).losses.shape == (2,)
    for loss in (DPOLoss(), RobustDPOLoss(), IPOLoss(), RPOLoss()):
        assert loss.requires_reference
        with pytest.raises(ValueError, match="needs the reference model's log-probs"):
            loss(no_ref)


def test_from_rows_reads_the_interleaved_layout():
    pairs = PairLogProbs.from_rows(torch.tensor([-5.0, -6.0, -3.0, -2.0]), torch.tensor([2.0, 4.0, 4.0, 2.0]),
                                   torch.tensor([-5.5, -5.5, -3.0, -2.5]), torch.tensor([0.5, 0.5, 0.0, 0.0]))
    assert pairs.chosen.tolist() == [-5.0, -3.0] and pairs.rejected.tolist() == [-6.0, -2.0]
    assert pairs.ref_rejected.tolist() == [-5.5, -2.5] and pairs.margin.tolist() == [0.5, 0.0]


def test_invalid_settings_and_frozen():
    for make in (lambda: DPOLoss(beta=0), lambda: DPOLoss(label_smoothing=0.6), lambda: RobustDPOLoss(label_smoothing=0.5),
                 lambda: IPOLoss(beta=-1), lambda: SimPOLoss(beta=0), lambda: RPOLoss(alpha=-1)):
        with pytest.raises(ValueError):
            make()
    with pytest.raises(AttributeError, match="read-only"):
        DPOLoss().beta = 0.5


# --------------------------------------------------------------- properties
values = st.floats(-30, 30, allow_nan=False)
betas = st.floats(0.01, 2.0)
smoothing = st.floats(0.0, 0.45)


def one_pair(h, chosen_tokens=3.0, rejected_tokens=3.0):
    """A pair whose log-ratio difference is h (policy = reference on the rejected side)."""
    t = lambda x: torch.tensor([x], dtype=torch.float64)  # noqa: E731
    return PairLogProbs(chosen=t(-10.0 + h), rejected=t(-10.0), chosen_tokens=t(chosen_tokens),
                        rejected_tokens=t(rejected_tokens), ref_chosen=t(-10.0), ref_rejected=t(-10.0))


@given(st.lists(values, min_size=2, max_size=8), betas, smoothing)
def test_dpo_and_robust_fall_as_the_log_ratio_gap_grows(hs, beta, eps):
    hs = sorted(hs)
    for loss in (DPOLoss(beta=beta), RobustDPOLoss(beta=beta, label_smoothing=eps)):
        out = [loss(one_pair(h)).losses.item() for h in hs]
        assert all(a >= b - 1e-12 for a, b in zip(out, out[1:]))


@given(values, values, values, betas)
def test_dpo_depends_on_the_log_ratio_difference_only(h, shift_c, shift_r, beta):
    base = DPOLoss(beta=beta)(one_pair(h)).losses
    p = one_pair(h)
    moved = with_(p, chosen=p.chosen + shift_c, ref_chosen=p.ref_chosen + shift_c,
                  rejected=p.rejected + shift_r, ref_rejected=p.ref_rejected + shift_r)
    torch.testing.assert_close(DPOLoss(beta=beta)(moved).losses, base)


@given(values, betas, st.floats(0.0, 0.5))
def test_label_smoothing_is_symmetric(h, beta, eps):
    """cDPO with eps on h is cDPO with 1 - eps on -h (written out: eps may not exceed 1/2 in the class)."""
    z = torch.tensor([beta * h], dtype=torch.float64)
    flipped = -eps * torch.nn.functional.logsigmoid(z) - (1 - eps) * torch.nn.functional.logsigmoid(-z)
    torch.testing.assert_close(DPOLoss(beta=beta, label_smoothing=eps)(one_pair(-h)).losses, flipped)
    if eps == 0.5:  # both labels equally likely: symmetric in h, smallest at h = 0
        half = DPOLoss(beta=beta, label_smoothing=0.5)
        torch.testing.assert_close(half(one_pair(h)).losses, half(one_pair(-h)).losses)
        assert half(one_pair(0.0)).losses.item() <= half(one_pair(h)).losses.item() + 1e-12


@given(values, betas, smoothing)
def test_robust_dpo_is_unbiased_under_flipped_labels(h, beta, eps):
    """E over a label flipped with probability eps of the robust loss = the clean DPO loss."""
    robust = RobustDPOLoss(beta=beta, label_smoothing=eps)
    expected = (1 - eps) * robust(one_pair(h)).losses + eps * robust(one_pair(-h)).losses
    torch.testing.assert_close(expected, DPOLoss(beta=beta)(one_pair(h)).losses)
    torch.testing.assert_close(RobustDPOLoss(beta=beta, label_smoothing=0.0)(one_pair(h)).losses,
                               DPOLoss(beta=beta)(one_pair(h)).losses)


@given(betas, st.floats(1.0, 8.0), st.floats(1.0, 8.0))
def test_ipo_minimum_is_at_one_over_two_beta(beta, n_c, n_r):
    target = 1 / (2 * beta)
    h = torch.tensor([target * n_c], dtype=torch.float64, requires_grad=True)  # h' = h / n_c at the optimum
    p = one_pair(0.0, n_c, n_r)
    loss = IPOLoss(beta=beta)(with_(p, chosen=p.ref_chosen + h)).losses.sum()
    (grad,) = torch.autograd.grad(loss, h)
    assert loss.item() == pytest.approx(0.0, abs=1e-9) and grad.abs().item() < 1e-9
    for off in (-0.5, 0.5):
        assert IPOLoss(beta=beta)(with_(p, chosen=p.ref_chosen + (target + off) * n_c)).losses.item() > 0


def test_dpo_small_beta_limit():
    """beta -> 0: loss = log 2 - beta h / 2 + O(beta^2) (the loss forgets the gap: any policy is as good)."""
    for h in (-3.0, 0.5, 4.0):
        beta = 1e-4
        loss = DPOLoss(beta=beta)(one_pair(h)).losses.item()
        assert (loss - math.log(2)) / beta == pytest.approx(-h / 2, rel=1e-3)
    # beta -> infinity: a 0-1 loss (no loss when the gap is positive, linear in -beta h when negative)
    assert DPOLoss(beta=1e4)(one_pair(1.0)).losses.item() < 1e-12
    assert DPOLoss(beta=1e4)(one_pair(-1.0)).losses.item() == pytest.approx(1e4)


@given(values, values, st.floats(1.0, 20.0), st.floats(1.0, 20.0), st.floats(1.0, 4.0))
def test_simpo_is_length_normalised(lc, lr, n_c, n_r, k):
    """Repeating a completion k times (log-prob and length both x k) leaves SimPO unchanged."""
    t = lambda x: torch.tensor([x], dtype=torch.float64)  # noqa: E731
    base = PairLogProbs(t(lc), t(lr), t(n_c), t(n_r))
    scaled = PairLogProbs(t(lc * k), t(lr * k), t(n_c * k), t(n_r * k))
    torch.testing.assert_close(SimPOLoss()(scaled).losses, SimPOLoss()(base).losses)


@given(values, betas, st.floats(0.0, 3.0))
def test_rpo_is_dpo_plus_the_chosen_nll(h, beta, alpha):
    p = one_pair(h)
    nll = -p.chosen / p.chosen_tokens
    torch.testing.assert_close(RPOLoss(beta=beta, alpha=alpha)(p).losses, DPOLoss(beta=beta)(p).losses + alpha * nll)


@given(st.lists(values, min_size=2, max_size=6), betas)
def test_margin_equals_a_smaller_gap(hs, beta):
    m = torch.full((1,), 0.3, dtype=torch.float64)
    for h in hs:
        torch.testing.assert_close(DPOLoss(beta=beta)(with_(one_pair(h), margin=m)).losses,
                                   DPOLoss(beta=beta)(one_pair(h - 0.3 / beta)).losses)


# ------------------------------------------------------------- TRL golden
def trl_dpo_loss(loss_types, loss_weights, beta, label_smoothing, pairs: PairLogProbs, width: int = 6):
    """TRL 1.16's `DPOTrainer._compute_loss` on fixed log-probs: its model returns per-token log-probs that
    sum to each row's log-prob over a completion of the given length, the reference ones are precomputed."""
    dpo = trl_module("trl.trainer.dpo_trainer")
    p = len(pairs.chosen)
    lengths = torch.cat([pairs.chosen_tokens, pairs.rejected_tokens]).long()  # TRL's batch: chosen rows, then rejected
    logps = torch.cat([pairs.chosen, pairs.rejected]).float()
    completion_mask = torch.zeros(2 * p, width, dtype=torch.long)
    for row, n in enumerate(lengths.tolist()):
        completion_mask[row, width - n :] = 1
    per_token = completion_mask[:, 1:].float() * (logps / lengths)[:, None]  # the model's log-probs at shift

    def model(**kwargs):
        zeros = torch.zeros_like(per_token)
        return types.SimpleNamespace(log_probs=per_token, entropy=zeros, mean_logits=zeros, is_top1=zeros.bool())

    identity = types.SimpleNamespace(device=torch.device("cpu"), gather_for_metrics=lambda x: x, gather=lambda x: x)
    trainer = types.SimpleNamespace(
        model=types.SimpleNamespace(training=False), accelerator=identity, aux_loss_enabled=False, ld_alpha=None,
        precompute_ref_logps=True, f_divergence_type="reverse_kl", loss_types=loss_types, loss_weights=loss_weights,
        beta=beta, label_smoothing=label_smoothing, use_weighting=False, args=types.SimpleNamespace(),
        _metrics={"eval": collections.defaultdict(list)}, _total_train_tokens=0, _tp_size=1)
    inputs = {"input_ids": torch.zeros(2 * p, width, dtype=torch.long),
              "attention_mask": torch.ones(2 * p, width, dtype=torch.long), "completion_mask": completion_mask,
              "ref_chosen_logps": pairs.ref_chosen.float(), "ref_rejected_logps": pairs.ref_rejected.float()}
    loss = dpo.DPOTrainer._compute_loss(trainer, model, inputs, False)
    return loss, {k: v[0] for k, v in trainer._metrics["eval"].items()}


@pytest.mark.parametrize("ours, trl", [
    (DPOLoss(beta=0.1), (["sigmoid"], [1.0], 0.1, 0.0)),
    (DPOLoss(beta=0.5), (["sigmoid"], [1.0], 0.5, 0.0)),
    (RobustDPOLoss(beta=0.1, label_smoothing=0.2), (["robust"], [1.0], 0.1, 0.2)),
    (IPOLoss(beta=0.1), (["ipo"], [1.0], 0.1, 0.0)),
    (IPOLoss(beta=0.7), (["ipo"], [1.0], 0.7, 0.0)),
])
def test_equals_trls_dpo_trainer(ours, trl):
    expected, metrics = trl_dpo_loss(*trl, PAIRS)
    out = ours(PAIRS)
    assert out.losses.mean().item() == pytest.approx(expected.item(), rel=1e-5)
    mine = preference_metrics(PAIRS, out)
    for name in ("rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies", "logps/chosen",
                 "logps/rejected"):
        assert mine[name].item() == pytest.approx(metrics[name], rel=1e-5, abs=1e-7), name


def test_rpo_equals_trls_sigmoid_plus_sft():
    """TRL's NLL term averages over all chosen tokens of the batch, the paper's per pair: equal with equal
    chosen lengths, which this case has."""
    pairs = with_(PAIRS, chosen_tokens=torch.tensor([3.0, 3.0], dtype=torch.float64))
    expected, _ = trl_dpo_loss(["sigmoid", "sft"], [1.0, 0.5], 0.1, 0.0, pairs)
    assert RPOLoss(beta=0.1, alpha=0.5)(pairs).losses.mean().item() == pytest.approx(expected.item(), rel=1e-5)


@pytest.mark.parametrize("beta, gamma", [(2.0, 1.0), (0.1, 0.5)])
def test_simpo_equals_trls_cpo_trainer(beta, gamma):
    """TRL 1.16's SimPO is `CPOTrainer.cpo_loss` with loss_type "simpo" on average log-probs."""
    cpo = trl_module("trl.experimental.cpo.cpo_trainer")
    trainer = types.SimpleNamespace(alpha=0.0, beta=beta, simpo_gamma=gamma, label_smoothing=0.0, loss_type="simpo",
                                    accelerator=types.SimpleNamespace(device=torch.device("cpu")))
    average = (PAIRS.chosen / PAIRS.chosen_tokens).float(), (PAIRS.rejected / PAIRS.rejected_tokens).float()
    losses, chosen_rewards, _ = cpo.CPOTrainer.cpo_loss(trainer, *average)
    out = SimPOLoss(beta=beta, gamma=gamma)(PAIRS)
    torch.testing.assert_close(out.losses.float(), losses)
    torch.testing.assert_close(out.chosen_rewards.float(), chosen_rewards)
