"""rlhf.algos.policy_loss: hand-computed cases for every loss, PPO clip properties, and the
padding / finiteness / sharding properties shared by all losses."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhf.algos.aggregation import count_seqs, count_tokens, seq_mean_token_mean, token_mean
from rlhf.algos.policy_loss import (
    CISPOLoss,
    ClipCovLoss,
    GMPOLoss,
    GPGLoss,
    GSPOLoss,
    KLCovLoss,
    PPOClipLoss,
    REINFORCELoss,
    SAPOLoss,
)

from .strategies import cases, perturb_padding

LN = math.log


def _grad(loss, x):
    (g,) = torch.autograd.grad(loss, x)
    return g


# ----------------------------------------------------------------------------- PPO golden
# tokens: (A, r) = (1, 1.1) inside; (1, 1.5) clipped at 1.2; (-1, 0.5) clipped at 0.8;
# (-2, 4) unclipped (loss 8), dual-clip bound -c A = 6 with c = 3; last token masked.
PPO_A = torch.tensor([[1.0, 1.0, -1.0, -2.0, 5.0]])
PPO_LR = torch.tensor([[LN(1.1), LN(1.5), LN(0.5), LN(4.0), 3.0]])
PPO_MASK = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]])


def _ppo_inputs():
    lp = torch.tensor([[-1.0, -2.0, -0.5, -3.0, -1.0]], requires_grad=True)
    return lp, (lp - PPO_LR).detach()


def test_ppo_golden():
    lp, old = _ppo_inputs()
    loss, m = PPOClipLoss()(lp, old, PPO_A, PPO_MASK)
    # per token: -1.1, -1.2, +0.8, +8 -> mean 6.5 / 4 = 1.625
    assert loss.item() == pytest.approx(1.625)
    assert m["pg_loss"].item() == pytest.approx(1.625)
    assert m["pg_clipfrac"].item() == pytest.approx(0.5)  # tokens 2 and 3
    assert m["pg_clipfrac_lower"].item() == 0.0
    # ppo_kl = mean(old - lp) = -ln(1.1 * 1.5 * 0.5 * 4) / 4 = -ln 3.3 / 4
    assert m["ppo_kl"].item() == pytest.approx(-LN(3.3) / 4)
    # gradient of -A r / 4 where unclipped: [-1.1/4, 0, 0, 8/4, 0]
    torch.testing.assert_close(_grad(loss, lp), torch.tensor([[-0.275, 0.0, 0.0, 2.0, 0.0]]))


def test_ppo_dual_clip_and_clip_higher_golden():
    lp, old = _ppo_inputs()
    loss, m = PPOClipLoss(dual_clip=3.0)(lp, old, PPO_A, PPO_MASK)
    # last valid token bounded by -3 * (-2) = 6: (-1.1 - 1.2 + 0.8 + 6) / 4 = 1.125
    assert loss.item() == pytest.approx(1.125)
    assert m["pg_clipfrac_lower"].item() == pytest.approx(0.25)
    torch.testing.assert_close(_grad(loss, lp), torch.tensor([[-0.275, 0.0, 0.0, 0.0, 0.0]]))
    loss, _ = PPOClipLoss(clip_high=0.28)(lp, old, PPO_A, PPO_MASK)
    # token 2 now clipped at 1.28: (-1.1 - 1.28 + 0.8 + 8) / 4 = 1.605
    assert loss.item() == pytest.approx(1.605)
    with pytest.raises(ValueError):
        PPOClipLoss(dual_clip=1.0)


@settings(max_examples=100)
@given(cases(), st.floats(0.05, 0.5), st.floats(0.05, 0.5), st.floats(1.5, 5.0))
def test_ppo_clip_properties(case, clip_low, clip_high, c):
    A = case.randn(scale=1.0)
    lp = case.randn(scale=1.0).requires_grad_(True)
    log_ratio = case.randn(scale=0.5)
    old = (lp - log_ratio).detach()
    r = torch.exp(log_ratio)
    loss_obj = PPOClipLoss(clip_low, clip_high, dual_clip=c)
    l, _ = loss_obj.token_loss(lp, old, A, case.mask)
    g = _grad(l.sum(), lp)
    inside = (r > 1 - clip_low) & (r < 1 + clip_high)
    upper = (A > 0) & (r > 1 + clip_high)
    lower = (A < 0) & (r < 1 - clip_low)
    dual = (A < 0) & (-A * r > -c * A)
    # inside the clip range (and below the dual bound) the loss is -A r with gradient -A r
    free = inside & ~dual
    torch.testing.assert_close(l[free], (-A * r)[free])
    torch.testing.assert_close(g[free], (-A * r)[free])
    # where a clip is active the gradient is exactly zero
    assert (g[upper | lower | dual] == 0).all()
    # dual clip bounds the loss of negative advantages by -c A
    assert (l[A < 0] <= (-c * A)[A < 0] + 1e-12).all()
    # at ratio 1 the loss is -A
    l1, _ = loss_obj.token_loss(lp, lp.detach(), A, case.mask)
    torch.testing.assert_close(l1, -A)


# ------------------------------------------------------------------------ other goldens
def test_gspo_golden():
    # one sequence, log-ratios [ln 2, 0]: s = exp(ln 2 / 2) = sqrt 2 = 1.414214
    lp = torch.tensor([[-1.0, -1.0]], requires_grad=True)
    old = (lp - torch.tensor([[LN(2.0), 0.0]])).detach()
    mask = torch.ones(1, 2)
    loss, m = GSPOLoss(clip_low=0.2, clip_high=0.2)(lp, old, torch.ones(1, 2), mask)
    assert loss.item() == pytest.approx(-1.2)  # A = 1: clipped at 1 + 0.2
    assert m["pg_clipfrac"].item() == 1.0
    assert (_grad(loss, lp) == 0).all()
    loss, m = GSPOLoss(clip_low=0.2, clip_high=0.2)(lp, old, -torch.ones(1, 2), mask)
    assert loss.item() == pytest.approx(math.sqrt(2))  # A = -1: max(sqrt 2, 1.2), unclipped
    # d/dlp_t of mean_t(sqrt2 * exp(lp_t - sg lp_t)) = sqrt 2 / 2 per token
    torch.testing.assert_close(_grad(loss, lp), torch.full((1, 2), math.sqrt(2) / 2))


def test_sapo_golden():
    # ratio 1: gate = sigmoid(0) * 4 / tau = 2 / tau; A = +1 (tau 1) -> -2; A = -1 (tau 1.05) -> 2 / 1.05
    lp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    loss, m = SAPOLoss()(lp, lp.detach(), torch.tensor([[1.0, -1.0]]), torch.ones(1, 2))
    assert loss.item() == pytest.approx((-2 + 2 / 1.05) / 2, abs=1e-6)  # -0.047619 (float32)
    # f'(1) = 1: gradient -A r / 2 = [-0.5, 0.5], exactly PPO's at ratio 1
    torch.testing.assert_close(_grad(loss, lp), torch.tensor([[-0.5, 0.5]]))
    assert set(m) == {"pg_loss", "ppo_kl"}


def test_gmpo_golden():
    # token log-ratios [0.1, 0.6, -0.5], clip 0.4 in log space
    lp = torch.tensor([[-1.0, -1.0, -1.0]], requires_grad=True)
    old = (lp - torch.tensor([[0.1, 0.6, -0.5]])).detach()
    mask = torch.ones(1, 3)
    loss, m = GMPOLoss()(lp, old, torch.ones(1, 3), mask)
    # A > 0: min(lr, 0.4) = [0.1, 0.4, -0.5], mean 0 -> rho = 1 -> L = -1
    assert loss.item() == pytest.approx(-1.0)
    assert m["pg_clipfrac"].item() == pytest.approx(1 / 3)
    loss, m = GMPOLoss()(lp, old, -torch.ones(1, 3), mask)
    # A < 0: max(lr, -0.4) = [0.1, 0.6, -0.4], mean 0.1 -> L = e^0.1 = 1.105171
    assert loss.item() == pytest.approx(math.exp(0.1))
    # d/dlp: e^0.1 / 3 for the unclipped tokens 0, 1; 0 for the clipped token 2
    torch.testing.assert_close(_grad(loss, lp), torch.tensor([[math.exp(0.1) / 3, math.exp(0.1) / 3, 0.0]]))


def test_cispo_golden():
    # lp = ln [0.6, 0.2], ratios [1.5, 0.5], clip_high 0.2, no lower bound: weights [1.2, 0.5]
    lp = torch.tensor([[LN(0.6), LN(0.2)]], requires_grad=True)
    old = (lp - torch.tensor([[LN(1.5), LN(0.5)]])).detach()
    loss, m = CISPOLoss()(lp, old, torch.ones(1, 2), torch.ones(1, 2))
    # l = -w A lp = [-1.2 ln 0.6, -0.5 ln 0.2] = [0.612990, 0.804719] -> mean 0.708855
    assert loss.item() == pytest.approx((-1.2 * LN(0.6) - 0.5 * LN(0.2)) / 2)
    torch.testing.assert_close(_grad(loss, lp), torch.tensor([[-0.6, -0.25]]))  # -w A / 2
    assert m["pg_clipfrac"].item() == 0.5
    loss, _ = CISPOLoss(clip_low=0.2)(lp, old, torch.ones(1, 2), torch.ones(1, 2))
    assert loss.item() == pytest.approx((-1.2 * LN(0.6) - 0.8 * LN(0.2)) / 2)  # 0.5 -> 0.8


@pytest.mark.parametrize("cls", [REINFORCELoss, GPGLoss])
def test_reinforce_golden(cls):
    lp = torch.tensor([[LN(0.5), LN(0.25), 7.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    loss, _ = cls()(lp, lp.detach() + 0.3, torch.tensor([[2.0, 1.0, 9.0]]), mask)
    # -A log p = [2 ln 2, 2 ln 2] -> mean 1.386294 (no ratio: old log-probs do not matter)
    assert loss.item() == pytest.approx(2 * LN(2.0))
    torch.testing.assert_close(_grad(loss, lp), torch.tensor([[-1.0, -0.5, 0.0]]))


def test_kl_cov_golden():
    # A = [1, 0, 0, -1] (mean 0), lp = [-1, -2, -3, -3.5] (mean -2.375)
    # cov = A * (lp + 2.375) = [1.375, 0, 0, 1.125]; ratio 0.25 of 4 tokens -> top 1 = token 0
    lp = torch.tensor([[-1.0, -2.0, -3.0, -3.5]], requires_grad=True)
    old = (lp - torch.tensor([[0.1, 0.0, 0.0, 0.0]])).detach()
    A = torch.tensor([[1.0, 0.0, 0.0, -1.0]])
    loss, m = KLCovLoss(kl_cov_ratio=0.25, ppo_kl_coef=1.0)(lp, old, A, torch.ones(1, 4))
    # l = -A r (+ |lr| on token 0) = [-e^0.1 + 0.1, 0, 0, 1] -> mean (1.1 - e^0.1) / 4 = -0.0012927
    assert loss.item() == pytest.approx((1.1 - math.exp(0.1)) / 4, abs=1e-6)  # float32
    assert m["pg_klcov_frac"].item() == 0.25
    # token 0 gradient: (-e^0.1 + 1 (sign of lr)) / 4; token 3: -A r / 4 = 0.25
    torch.testing.assert_close(_grad(loss, lp), torch.tensor([[(1 - math.exp(0.1)) / 4, 0.0, 0.0, 0.25]]))


def test_clip_cov_golden():
    # A = [2, 0.1, -0.1, -2] (mean 0), lp = [-1, -2, -3, -4] (mean -2.5), ratio 1
    # cov = [3, 0.05, 0.05, 3]: tokens 0 and 3 lie in (1, 5); ratio 0.5 of 4 -> pick both
    lp = torch.tensor([[-1.0, -2.0, -3.0, -4.0]], requires_grad=True)
    A = torch.tensor([[2.0, 0.1, -0.1, -2.0]])
    loss_obj = ClipCovLoss(clip_cov_ratio=0.5, generator=torch.Generator().manual_seed(0))
    loss, m = loss_obj(lp, lp.detach(), A, torch.ones(1, 4))
    assert loss.item() == pytest.approx(0.0, abs=1e-6)  # mean(-A) = 0: detaching keeps the value
    assert m["pg_clipcov_frac"].item() == 0.5
    assert m["pg_clipfrac"].item() == 0.0
    # gradient -A / 4 except the detached tokens 0 and 3
    torch.testing.assert_close(_grad(loss, lp), torch.tensor([[0.0, -0.025, 0.025, 0.0]]))


def test_clip_cov_picks_a_random_subset_of_candidates():
    g = torch.Generator().manual_seed(3)
    A = torch.randn(8, 50, generator=g) * 3
    lp = torch.randn(8, 50, generator=g) * 3
    loss_obj = ClipCovLoss(clip_cov_ratio=0.01, clip_cov_lb=0.5, clip_cov_ub=50.0, generator=torch.Generator().manual_seed(0))
    _, m = loss_obj(lp, lp, A, torch.ones(8, 50))
    assert m["pg_clipcov_frac"].item() == pytest.approx(4 / 400)  # floor(0.01 * 400) = 4 tokens


def test_rollout_is_weights_multiply_the_token_loss_without_gradient():
    lp, old = _ppo_inputs()
    w = torch.tensor([[0.5, 2.0, 1.0, 0.25, 3.0]], requires_grad=True)
    loss, _ = PPOClipLoss()(lp, old, PPO_A, PPO_MASK, rollout_is_weights=w)
    # (0.5 * -1.1 + 2 * -1.2 + 0.8 + 0.25 * 8) / 4 = -0.0375
    assert loss.item() == pytest.approx(-0.0375)
    loss.backward()
    assert w.grad is None


def test_gmpo_weights_combine_by_geometric_mean():
    lp = torch.zeros(1, 2, requires_grad=True)
    w = torch.tensor([[4.0, 1.0]])  # geometric mean 2
    loss, _ = GMPOLoss()(lp, lp.detach(), torch.ones(1, 2), torch.ones(1, 2), rollout_is_weights=w)
    assert loss.item() == pytest.approx(-2.0)


# ---------------------------------------------------------------- shared properties
def _all_losses():
    return [
        PPOClipLoss(dual_clip=3.0),
        PPOClipLoss(clip_high=0.28, aggregate=seq_mean_token_mean),
        GSPOLoss(),
        SAPOLoss(),
        GPGLoss(),
        ClipCovLoss(generator=torch.Generator().manual_seed(0)),
        KLCovLoss(),
        GMPOLoss(),
        CISPOLoss(),
        REINFORCELoss(),
    ]


def _inputs(case):
    lp = case.randn()
    old = lp + case.randn(scale=min(case.scale, 1.0)) if case.scale < 100 else case.randn()
    return lp, old, case.randn(scale=1.0)


@settings(max_examples=100)
@given(cases())
def test_finite_and_padding_never_leaks(case):
    lp, old, A = _inputs(case)
    noisy = [perturb_padding(x, case.mask, case.gen) for x in (lp, old, A)]
    for loss_obj, twin in zip(_all_losses(), _all_losses()):  # twins: same seeded random state
        a_lp = lp.clone().requires_grad_(True)
        b_lp = noisy[0].clone().requires_grad_(True)
        a, ma = loss_obj(a_lp, old, A, case.mask)
        b, mb = twin(b_lp, noisy[1], noisy[2], case.mask)
        assert torch.isfinite(a), loss_obj
        ga, gb = _grad(a, a_lp), _grad(b, b_lp)
        assert torch.isfinite(ga).all(), loss_obj
        torch.testing.assert_close(a, b, msg=repr(loss_obj))
        torch.testing.assert_close(ga, gb, msg=repr(loss_obj))
        assert (gb[case.mask == 0] == 0).all()
        assert ma.keys() == mb.keys() and {"pg_loss", "ppo_kl"} <= ma.keys()
        for k in ma:
            assert torch.isfinite(ma[k]), (loss_obj, k)
            torch.testing.assert_close(ma[k], mb[k], msg=f"{loss_obj} {k}")


@settings(max_examples=100)
@given(cases(max_b=6), st.integers(1, 6))
def test_micro_batches_with_global_counts_sum_to_full_batch(case, micro):
    lp, old, A = _inputs(case)
    n_tok, n_seq = count_tokens(case.mask), count_seqs(case.mask)
    for loss_obj in _all_losses():
        if isinstance(loss_obj, (ClipCovLoss, KLCovLoss)):
            continue  # their token selection uses statistics of the whole call
        x = lp.clone().requires_grad_(True)
        full, _ = loss_obj(x, old, A, case.mask)
        g_full = _grad(full, x)
        parts = sum(
            loss_obj(x[rows], old[rows], A[rows], case.mask[rows], num_tokens=n_tok, num_seqs=n_seq)[0]
            for rows in torch.arange(case.B).split(micro)
        )
        torch.testing.assert_close(parts, full, msg=repr(loss_obj))
        torch.testing.assert_close(_grad(parts, x), g_full, msg=repr(loss_obj))


def test_ratio_one_gradients_agree_across_losses():
    """At pi_theta = pi_old every ratio-based loss has the policy-gradient -A grad log p."""
    g = torch.Generator().manual_seed(0)
    lp = -torch.rand(3, 5, generator=g, dtype=torch.float64)
    A = torch.randn(3, 5, generator=g, dtype=torch.float64)
    mask = torch.ones(3, 5, dtype=torch.float64)
    expected = -A / 15
    for loss_obj in [PPOClipLoss(), CISPOLoss(), SAPOLoss(aggregate=token_mean), REINFORCELoss(), ClipCovLoss(clip_cov_lb=1e9)]:
        x = lp.clone().requires_grad_(True)
        loss, _ = loss_obj(x, lp, A, mask)
        torch.testing.assert_close(_grad(loss, x), expected, msg=repr(loss_obj))


@settings(max_examples=100)
@given(cases(max_b=6), st.data())
def test_rows_with_zero_advantages_add_nothing_where_a_loss_says_so(case, data):
    """`zero_advantage_rows_inert`: leaving out the rows whose advantages are all 0 (the global counts kept)
    gives the same loss, and those rows' gradient is exactly 0. Clip-Cov and KL-Cov do not say so: their token
    selection reads the whole batch."""
    lp, old, A = _inputs(case)
    zero = torch.tensor(data.draw(st.lists(st.booleans(), min_size=case.B, max_size=case.B)))
    A = torch.where(zero[:, None], 0.0, A)
    kept = (~zero).nonzero().squeeze(-1)
    n_tok, n_seq = count_tokens(case.mask), count_seqs(case.mask)
    inert = [type(loss) for loss in _all_losses() if loss.zero_advantage_rows_inert]
    assert ClipCovLoss not in inert and KLCovLoss not in inert and len(inert) == 8  # every other one says so
    for loss_obj in _all_losses():
        if not loss_obj.zero_advantage_rows_inert:
            continue
        x = lp.clone().requires_grad_(True)
        full, _ = loss_obj(x, old, A, case.mask, num_tokens=n_tok, num_seqs=n_seq, max_new_tokens=case.T)
        g = _grad(full, x)
        assert (g[zero] == 0).all(), loss_obj
        if len(kept):
            y = lp[kept].clone().requires_grad_(True)
            part, _ = loss_obj(y, old[kept], A[kept], case.mask[kept], num_tokens=n_tok, num_seqs=n_seq,
                               max_new_tokens=case.T)
            torch.testing.assert_close(part, full, msg=repr(loss_obj))
            torch.testing.assert_close(_grad(part, y), g[kept], msg=repr(loss_obj))
        else:
            assert full == 0, loss_obj
