"""rlhf.algos.kl: estimator values, unbiasedness on exact samples, loss, penalty, controllers."""

import math

import pytest
import torch
from hypothesis import given, settings

from rlhf.algos.aggregation import seq_mean_token_sum
from rlhf.algos.kl import (
    AdaptiveKLController,
    FixedKLController,
    KLLoss,
    StraightThrough,
    apply_kl_penalty,
    kl_abs,
    kl_k1,
    kl_k2,
    kl_k3,
)

from .strategies import cases, perturb_padding

LN2 = math.log(2.0)
LP = torch.tensor([[math.log(0.5), math.log(0.25)]])
REF = torch.tensor([[math.log(0.25), math.log(0.5)]])
ESTIMATORS = [kl_k1, kl_abs, kl_k2, kl_k3, StraightThrough()]


def test_golden_estimators():
    # log pi - log pi_ref = [ln 2, -ln 2]
    torch.testing.assert_close(kl_k1(LP, REF), torch.tensor([[LN2, -LN2]]))
    torch.testing.assert_close(kl_abs(LP, REF), torch.tensor([[LN2, LN2]]))
    torch.testing.assert_close(kl_k2(LP, REF), torch.tensor([[0.5 * LN2**2, 0.5 * LN2**2]]))  # 0.240227
    # r = pi_ref / pi = [1/2, 2]: k3 = r - 1 - ln r = [-1/2 + ln 2, 1 - ln 2] = [0.193147, 0.306853]
    torch.testing.assert_close(kl_k3(LP, REF), torch.tensor([[LN2 - 0.5, 1 - LN2]]))
    # clamp: r = e^5 -> k3 = e^5 - 6 = 142.4, clamped to 10
    assert kl_k3(torch.tensor([0.0]), torch.tensor([5.0])).item() == 10.0
    assert kl_k3(torch.tensor([0.0]), torch.tensor([5.0]), clamp=200.0).item() == pytest.approx(math.exp(5) - 6)


P = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
Q = torch.tensor([0.2, 0.5, 0.3], dtype=torch.float64)
# KL(p || q) = .5 ln 2.5 + .3 ln .6 + .2 ln(2/3) = .458145 - .153248 - .081093 = 0.223805
EXACT_KL = 0.5 * math.log(2.5) + 0.3 * math.log(0.6) + 0.2 * math.log(2 / 3)


@pytest.mark.parametrize("estimator", [kl_k1, kl_k3])
def test_unbiased_on_exact_samples(estimator):
    # exact expectation over the three outcomes
    k = estimator(P.log(), Q.log())
    assert (P * k).sum().item() == pytest.approx(EXACT_KL, abs=1e-12)
    # and a Monte-Carlo estimate from seeded samples of p
    y = torch.multinomial(P, 200_000, replacement=True, generator=torch.Generator().manual_seed(0))
    mc = estimator(P.log()[y], Q.log()[y]).mean().item()
    assert mc == pytest.approx(EXACT_KL, abs=0.01)


def test_k2_is_biased_but_close_for_small_kl():
    # E_p[k2] = E_p[(ln p/q)^2] / 2 >= KL^2 / 2; for this pair 0.2636 vs KL 0.2238
    k2 = (P * kl_k2(P.log(), Q.log())).sum().item()
    assert k2 == pytest.approx(0.5 * (0.5 * math.log(2.5) ** 2 + 0.3 * math.log(0.6) ** 2 + 0.2 * math.log(2 / 3) ** 2))
    assert k2 > EXACT_KL


@settings(max_examples=40)
@given(cases())
def test_nonnegative_zero_at_equality_and_finite(case):
    lp, ref = case.randn(), case.randn()
    for est in (kl_abs, kl_k2, kl_k3, StraightThrough()):
        k = est(lp, ref)
        assert (k >= 0).all() and torch.isfinite(k).all()
    for est in ESTIMATORS:
        assert torch.equal(est(lp, lp), torch.zeros_like(lp))
    lp.requires_grad_(True)
    for est in ESTIMATORS:
        (g,) = torch.autograd.grad(est(lp, ref).sum(), lp)
        assert torch.isfinite(g).all()


def test_straight_through_value_of_k3_gradient_of_k2():
    lp = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    ref = torch.tensor([[-1.5, -1.0, -0.4]])
    st_kl = StraightThrough(value=kl_k3, grad=kl_k2)(lp, ref)
    torch.testing.assert_close(st_kl, kl_k3(lp, ref))
    (g,) = torch.autograd.grad(st_kl.sum(), lp)
    # d/dlp of (lp - ref)^2 / 2 = lp - ref = [0.5, -1.0, -0.1]
    torch.testing.assert_close(g, torch.tensor([[0.5, -1.0, -0.1]]))


def test_kl_loss_golden_and_padding():
    mask = torch.tensor([[1.0, 1.0]])
    loss, metrics = KLLoss(estimator=kl_k3, coef=0.1)(LP, REF, mask)
    # token mean of k3 = (ln 2 - 0.5 + 1 - ln 2) / 2 = 0.25; loss = 0.1 * 0.25
    assert loss.item() == pytest.approx(0.025)
    assert metrics["kl_loss"].item() == pytest.approx(0.25)
    assert metrics["kl_coef"].item() == pytest.approx(0.1)
    loss, metrics = KLLoss(estimator=kl_k1, coef=1.0, aggregate=seq_mean_token_sum)(LP, REF, torch.tensor([[1.0, 0.0]]))
    assert loss.item() == pytest.approx(LN2)  # only the first token: ln 2, one sequence


@settings(max_examples=30)
@given(cases())
def test_kl_loss_ignores_padding(case):
    lp, ref = case.randn(), case.randn()
    noisy_lp = perturb_padding(lp, case.mask, case.gen).requires_grad_(True)
    lp.requires_grad_(True)
    kl = KLLoss(coef=0.5)
    a, _ = kl(lp, ref, case.mask)
    b, _ = kl(noisy_lp, perturb_padding(ref, case.mask, case.gen), case.mask)
    torch.testing.assert_close(a, b)
    (ga,) = torch.autograd.grad(a, lp)
    (gb,) = torch.autograd.grad(b, noisy_lp)
    torch.testing.assert_close(ga, gb)


def test_apply_kl_penalty_golden():
    scores = torch.tensor([[0.0, 1.0]])
    rewards, kl = apply_kl_penalty(scores, LP, REF, torch.tensor([[1.0, 1.0]]), coef=0.1)
    # k1 = [ln 2, -ln 2]; r = s - 0.1 k1 = [-0.0693147, 1.0693147]
    torch.testing.assert_close(rewards, torch.tensor([[-0.1 * LN2, 1 + 0.1 * LN2]]))
    torch.testing.assert_close(kl, torch.tensor([[LN2, -LN2]]))
    rewards, kl = apply_kl_penalty(scores, LP, REF, torch.tensor([[1.0, 0.0]]), coef=0.1)
    torch.testing.assert_close(rewards, torch.tensor([[-0.1 * LN2, 0.0]]))  # masked position -> 0
    torch.testing.assert_close(kl, torch.tensor([[LN2, 0.0]]))


def test_adaptive_controller_golden_and_checkpoint():
    ctl = AdaptiveKLController(init_coef=0.2, target_kl=6.0, horizon=10_000)
    ctl.update(current_kl=9.0, n_steps=1000)  # error clip(0.5) = 0.2 -> x(1 + 0.2 * 0.1) = 0.204
    assert ctl.value == pytest.approx(0.204)
    ctl.update(current_kl=torch.tensor(3.0), n_steps=500)  # error -0.2 -> x(1 - 0.01) = 0.20196
    assert ctl.value == pytest.approx(0.20196)
    ctl.update(current_kl=6.6, n_steps=10_000)  # error 0.1 -> x1.1 = 0.222156
    assert ctl.value == pytest.approx(0.222156)
    restored = AdaptiveKLController(init_coef=0.2, target_kl=6.0, horizon=10_000)
    restored.load_state_dict(ctl.state_dict())
    assert restored.value == ctl.value
    with pytest.raises(ValueError):
        AdaptiveKLController(0.1, target_kl=0.0, horizon=1)


def test_fixed_controller():
    ctl = FixedKLController(0.05)
    ctl.update(100.0, 10)
    assert ctl.value == 0.05
    other = FixedKLController(1.0)
    other.load_state_dict(ctl.state_dict())
    assert other.value == 0.05
