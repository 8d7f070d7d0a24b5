"""rlhf.algos.rollout_correction: TIS weights, rejection masks, diagnostics, bypass."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhf.algos.kl import kl_k1, kl_k2, kl_k3
from rlhf.algos.rollout_correction import (
    DecoupledPPO,
    RejectionMask,
    RolloutCorrection,
    SequenceTIS,
    TokenTIS,
    effective_sample_size,
    mismatch_metrics,
    reduce_seq_max,
    reduce_seq_mean,
    reduce_seq_sum,
    reduce_token,
)

from .strategies import cases, perturb_padding

LN = math.log
# token ratios rho = pi_old / pi_rollout = [3, 0.6, 1.5] and a masked fourth token
LP = torch.tensor([[-1.0, -2.0, -0.5, -1.0]])
ROLLOUT = LP - torch.tensor([[LN(3.0), LN(0.6), LN(1.5), 5.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0]])


def test_token_tis_golden():
    w, m = TokenTIS(threshold=2.0)(LP, ROLLOUT, MASK)
    torch.testing.assert_close(w, torch.tensor([[2.0, 0.6, 1.5, 0.0]]))  # min(rho, 2), 0 when masked
    assert m["rollout_is_mean"].item() == pytest.approx(4.1 / 3)
    assert m["rollout_is_max"].item() == pytest.approx(3.0)  # before truncation
    assert m["rollout_is_min"].item() == pytest.approx(0.6)
    assert m["rollout_is_ratio_fraction_high"].item() == pytest.approx(1 / 3)  # rho > 2
    assert m["rollout_is_ratio_fraction_low"].item() == 0.0  # rho < 1/2
    # ESS = mean^2 / mean(w^2) = (4.1/3)^2 / ((4 + .36 + 2.25) / 3) = 0.848210
    assert m["rollout_is_eff_sample_size"].item() == pytest.approx((4.1 / 3) ** 2 / (6.61 / 3), rel=1e-5)
    w, m = TokenTIS(threshold=2.0, batch_normalize=True)(LP, ROLLOUT, MASK)
    torch.testing.assert_close(w, torch.tensor([[2.0, 0.6, 1.5, 0.0]]) / (4.1 / 3))
    assert m["rollout_is_batch_norm_factor"].item() == pytest.approx(4.1 / 3)


def test_sequence_tis_golden():
    lp = torch.zeros(3, 2)
    rollout = -torch.tensor([[LN(2.0), LN(2.0)], [LN(0.5), 7.0], [1.0, 1.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [0.0, 0.0]])
    # sequence ratios: 2 * 2 = 4 -> truncated to 2; 0.5; the empty row gets weight 0
    w, m = SequenceTIS(threshold=2.0)(lp, rollout, mask)
    torch.testing.assert_close(w, torch.tensor([[2.0, 2.0], [0.5, 0.0], [0.0, 0.0]]))
    assert m["rollout_is_ratio_fraction_high"].item() == pytest.approx(0.5)
    assert m["rollout_is_max"].item() == pytest.approx(4.0)
    w, _ = SequenceTIS(threshold=2.0, batch_normalize=True)(lp, rollout, mask)
    torch.testing.assert_close(w, torch.tensor([[1.6, 1.6], [0.4, 0.0], [0.0, 0.0]]))  # / mean 1.25


def test_rejection_golden():
    # k1 = log pi_rollout - log pi_old = -ln rho = [-1.0986, 0.5108, -0.4055]: keep |k1| <= ln 2
    keep_ratio = RejectionMask(estimator=kl_k1, reduce=reduce_token, lower=-LN(2.0), upper=LN(2.0))
    mask, m = keep_ratio(LP, ROLLOUT, MASK)
    torch.testing.assert_close(mask, torch.tensor([[0.0, 1.0, 1.0, 0.0]]))
    assert m["rollout_rs_masked_fraction"].item() == pytest.approx(1 / 3)
    assert m["rollout_rs_seq_masked_fraction"].item() == 1.0
    # sequence mean of k3 = mean(rho - 1 - ln rho) = (0.901388 + 0.110826 + 0.094535) / 3 = 0.368916
    k3_mean = ((3 - 1 - LN(3)) + (0.6 - 1 - LN(0.6)) + (1.5 - 1 - LN(1.5))) / 3
    mask, m = RejectionMask(upper=0.3, estimator=kl_k3, reduce=reduce_seq_mean)(LP, ROLLOUT, MASK)
    assert mask.sum().item() == 0.0
    assert m["rollout_rs_stat_mean"].item() == pytest.approx(k3_mean, rel=1e-5)
    mask, _ = RejectionMask(upper=0.4, estimator=kl_k3, reduce=reduce_seq_mean)(LP, ROLLOUT, MASK)
    torch.testing.assert_close(mask, MASK)
    # seq max of k2 = max((ln rho)^2 / 2) = (ln 3)^2 / 2 = 0.603474; sum of k1 = -ln(3 * .6 * 1.5) = -0.99325
    _, m = RejectionMask(upper=1.0, estimator=kl_k2, reduce=reduce_seq_max)(LP, ROLLOUT, MASK)
    assert m["rollout_rs_stat_max"].item() == pytest.approx(LN(3) ** 2 / 2, rel=1e-5)
    _, m = RejectionMask(upper=1.0, estimator=kl_k1, reduce=reduce_seq_sum)(LP, ROLLOUT, MASK)
    assert m["rollout_rs_stat_mean"].item() == pytest.approx(-LN(2.7), rel=1e-5)


def test_token_veto_rejects_the_whole_sequence():
    lp = torch.zeros(2, 3)
    rollout = torch.tensor([[0.0, LN(1e5), 0.0], [0.1, -0.1, 0.0]])  # row 0 has rho = 1e-5 < 1e-4
    veto = RejectionMask(estimator=kl_k1, reduce=reduce_seq_max, upper=-LN(1e-4))
    mask, m = veto(lp, rollout, torch.ones(2, 3))
    torch.testing.assert_close(mask, torch.tensor([[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]]))
    assert m["rollout_rs_seq_masked_fraction"].item() == 0.5


def test_mismatch_metrics_golden():
    # log pi_old = [ln .5, ln .5], log pi_rollout = [ln .25, ln .5]: rho = [2, 1]
    lp = torch.tensor([[LN(0.5), LN(0.5)]], dtype=torch.float64)
    rollout = torch.tensor([[LN(0.25), LN(0.5)]], dtype=torch.float64)
    m = mismatch_metrics(lp, rollout, torch.ones(1, 2))
    expected = {
        "kl": -LN(2) / 2,  # mean(-ln rho)
        "k3_kl": (1 - LN(2)) / 2,  # mean(rho - 1 - ln rho)
        "chi2_token": 1.5,  # (4 + 1) / 2 - 1
        "chi2_seq": 3.0,  # (2 * 1)^2 - 1
        "ess_token": 0.9,  # 1.5^2 / 2.5
        "ess_seq": 1.0,
        "training_ppl": 2.0,  # exp(-ln .5)
        "rollout_ppl": math.sqrt(8),  # exp(-(ln .25 + ln .5) / 2)
        "log_ppl_diff": -LN(2) / 2,
        "log_ppl_abs_diff": LN(2) / 2,
        "ppl_ratio": 2**-0.5,
    }
    for k, v in expected.items():
        assert m[k].item() == pytest.approx(v, rel=1e-5), k


def test_effective_sample_size():
    w = torch.tensor([1.0, 1.0, 1.0, 0.0])
    assert effective_sample_size(w, torch.tensor([1, 1, 1, 0])).item() == pytest.approx(1.0)
    assert effective_sample_size(w, torch.ones(4)).item() == pytest.approx(0.75)  # (3/4)^2 / (3/4)
    assert effective_sample_size(w, torch.zeros(4)).item() == 0.0


@settings(max_examples=30)
@given(cases(), st.sampled_from([1.5, 2.0, 10.0]))
def test_weight_and_mask_properties(case, threshold):
    lp = case.randn()
    rollout = lp + case.randn(scale=min(case.scale, 3.0))
    noisy_lp, noisy_ro = perturb_padding(lp, case.mask, case.gen), perturb_padding(rollout, case.mask, case.gen)
    for tis in (TokenTIS(threshold), SequenceTIS(threshold), TokenTIS(threshold, batch_normalize=True)):
        w, m = tis(lp, rollout, case.mask)
        assert (w >= 0).all() and (w[case.mask == 0] == 0).all() and not w.requires_grad
        if not tis.batch_normalize:
            assert (w <= threshold * (1 + 1e-12)).all()
        elif (w > 0).any():
            sel = w[case.mask != 0] if isinstance(tis, TokenTIS) else w[:, 0][case.mask.any(-1).bool()]
            assert sel.mean().item() == pytest.approx(1.0)
        assert all(torch.isfinite(v) for v in m.values())
        w2, m2 = tis(noisy_lp, noisy_ro, case.mask)
        torch.testing.assert_close(w2, w)
    tight, loose = (RejectionMask(upper=u, estimator=kl_k3, reduce=reduce_token) for u in (0.05, 0.5))
    mt, _ = tight(lp, rollout, case.mask)
    ml, _ = loose(lp, rollout, case.mask)
    assert ((mt != 0) <= (ml != 0)).all() and ((ml != 0) <= (case.mask != 0)).all()
    torch.testing.assert_close(tight(noisy_lp, noisy_ro, case.mask)[0], mt)
    m = mismatch_metrics(lp, rollout, case.mask)
    assert all(torch.isfinite(v) for v in m.values())
    assert m["chi2_token"] >= -1 and m["k3_kl"] >= 0  # chi2 is >= 0 only in expectation
    same = mismatch_metrics(lp, lp, case.mask)
    for k in ("kl", "k3_kl", "chi2_token", "chi2_seq", "log_ppl_diff"):
        assert same[k].item() == pytest.approx(0.0, abs=1e-6)


def test_rollout_correction_modes():
    rc = RolloutCorrection(
        is_weights=TokenTIS(2.0),
        rejections=[RejectionMask(estimator=kl_k1, reduce=reduce_token, lower=-LN(2.0), upper=LN(2.0))],
    )
    out = rc(LP, ROLLOUT, MASK)
    torch.testing.assert_close(out.response_mask, torch.tensor([[0.0, 1.0, 1.0, 0.0]]))
    torch.testing.assert_close(out.rollout_is_weights, torch.tensor([[0.0, 0.6, 1.5, 0.0]]))
    assert torch.equal(out.old_log_probs, LP)
    assert {"rollout_rs_masked_fraction", "rollout_is_mean", "kl", "chi2_seq"} <= out.metrics.keys()

    bypass = RolloutCorrection(bypass=True)(None, ROLLOUT, MASK)
    assert torch.equal(bypass.old_log_probs, ROLLOUT) and bypass.rollout_is_weights is None
    with pytest.raises(ValueError):
        RolloutCorrection(is_weights=TokenTIS(), bypass=True)
    with pytest.raises(ValueError):
        RolloutCorrection()(None, ROLLOUT, MASK)
    with pytest.raises(ValueError):
        RolloutCorrection(rejections=[RejectionMask(upper=1.0), RejectionMask(upper=2.0)])


def test_decoupled_ppo_golden():
    # behaviour weights w = pi_prox / pi_behav = [3, 0.6, 1.5] (the masked 4th token ignored): cap 2 drops the 3
    w, m = DecoupledPPO(behaviour_weight_cap=2.0)(LP, ROLLOUT, MASK)
    torch.testing.assert_close(w, torch.tensor([[0.0, 0.6, 1.5, 0.0]]))
    assert m["behaviour_weight_mean"].item() == pytest.approx((3 + 0.6 + 1.5) / 3)  # before the cap
    assert m["behaviour_capped_fraction"].item() == pytest.approx(1 / 3)
    w, m = DecoupledPPO()(LP, ROLLOUT, MASK)  # AReaL's cap 5 keeps all three
    torch.testing.assert_close(w, torch.tensor([[3.0, 0.6, 1.5, 0.0]]))
    assert m["behaviour_capped_fraction"].item() == 0.0
    with pytest.raises(ValueError, match="must be > 1"):
        DecoupledPPO(behaviour_weight_cap=1.0)


@settings(max_examples=40)
@given(case=cases(), cap=st.floats(1.01, 10.0))
def test_decoupled_ppo_weights_are_the_ratio_below_the_cap_and_zero_elsewhere(case, cap):
    """Whatever the padding holds, every weight is pi_prox / pi_behav where that is <= cap and the token counts,
    and 0 otherwise; no gradient flows through them."""
    prox = case.randn()
    behav = prox + case.randn(scale=1.0)
    prox.requires_grad_(True)
    w, m = DecoupledPPO(cap)(perturb_padding(prox, case.mask, case.gen), perturb_padding(behav, case.mask, case.gen),
                             case.mask)
    ratio = torch.exp((prox - behav).detach())
    expected = torch.where((case.mask != 0) & (ratio <= cap), ratio, torch.zeros(()))
    torch.testing.assert_close(w, expected, rtol=1e-5, atol=0)
    assert not w.requires_grad
    valid = case.mask != 0
    if valid.any():
        assert m["behaviour_capped_fraction"].item() == pytest.approx(float((ratio[valid] > cap).float().mean()))
