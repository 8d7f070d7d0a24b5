"""rlhf.algos.advantages: hand-computed cases for every estimator, GAE against a per-step
reference loop, and the group properties (zero sum, shift/scale invariance, permutation)."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhf.algos.advantages import (
    GAE,
    GPG,
    GRPO,
    OPO,
    RLOO,
    AdvantageInputs,
    GRPOPassK,
    OptimalTokenBaseline,
    ReinforcePlusPlus,
    ReinforcePlusPlusBaseline,
    ReMax,
)

from .strategies import cases, grouped_cases, outcome_rewards, perturb_padding

# ------------------------------------------------------------------ group golden batch
# row: group id, length, score
ROWS = [(10, 3, 1.0), (3, 1, 3.0), (10, 1, 0.0), (-4, 2, 2.0), (10, 2, 0.0), (3, 4, 1.0), (10, 2, 1.0)]
IDS = torch.tensor([r[0] for r in ROWS])
LENS = torch.tensor([r[1] for r in ROWS])
MASK = (torch.arange(4) < LENS[:, None]).float()
REWARDS = torch.zeros(7, 4)
REWARDS[torch.arange(7), LENS - 1] = torch.tensor([r[2] for r in ROWS])
GROUP_INPUTS = AdvantageInputs(REWARDS, MASK, group_ids=IDS)
# group 10: rows 0, 2, 4, 6, scores [1, 0, 0, 1]; group 3: rows 1, 5, scores [3, 1]; -4: singleton


def per_seq(adv, mask):
    """The constant per-row value of a sequence-level advantage."""
    return (adv * mask).sum(-1) / mask.sum(-1).clamp_min(1)


def assert_broadcast(adv, mask, expected):
    torch.testing.assert_close(adv, torch.tensor(expected, dtype=adv.dtype)[:, None] * mask.to(adv.dtype))


def test_grpo_golden():
    adv, ret = GRPO()(GROUP_INPUTS)
    # group 10: mean .5, unbiased std sqrt(4 * .25 / 3) = .577350 -> +-.5 / (.577350 + 1e-6) = +-.866024
    # group 3: mean 2, std sqrt 2 -> +-1 / (1.414214 + 1e-6) = +-.707106; singleton -> 0
    a, b = 0.5 / (math.sqrt(1 / 3) + 1e-6), 1 / (math.sqrt(2) + 1e-6)
    assert_broadcast(adv, MASK, [a, b, -a, 0.0, -a, -b, a])
    assert torch.equal(adv, ret)
    adv, _ = GRPO(norm_by_std=False)(GROUP_INPUTS)  # Dr.GRPO: score - group mean
    assert_broadcast(adv, MASK, [0.5, 1.0, -0.5, 0.0, -0.5, -1.0, 0.5])


def test_rloo_golden():
    adv, _ = RLOO()(GROUP_INPUTS)
    # group 10: s_i - (2 - s_i) / 3 -> 1 - 1/3 = 2/3, 0 - 2/3; group 3: 3 - 1 = 2, 1 - 3 = -2
    assert_broadcast(adv, MASK, [2 / 3, 2.0, -2 / 3, 0.0, -2 / 3, -2.0, 2 / 3])


def test_opo_golden():
    adv, _ = OPO()(GROUP_INPUTS)
    # group 10: lengths [3, 1, 2, 2], baseline (3*1 + 0 + 0 + 2*1) / 8 = .625
    # group 3: lengths [1, 4], baseline (1*3 + 4*1) / 5 = 1.4
    assert_broadcast(adv, MASK, [0.375, 1.6, -0.625, 0.0, -0.625, -0.4, 0.375])


def test_gpg_golden():
    adv, _ = GPG()(GROUP_INPUTS)
    # 6 of 7 samples are in groups with reward spread: alpha = 7 / 6
    k = 7 / 6
    assert_broadcast(adv, MASK, [0.5 * k, 1.0 * k, -0.5 * k, 0.0, -0.5 * k, -1.0 * k, 0.5 * k])
    adv, _ = GPG(f_norm=2.0, rescale=False)(GROUP_INPUTS)
    assert_broadcast(adv, MASK, [0.25, 0.5, -0.25, 0.0, -0.25, -0.5, 0.25])


def test_passk_golden():
    adv, _ = GRPOPassK()(GROUP_INPUTS)
    # group 10: tie 1, 1 -> best (row 0) gets 1 - 1 = 0; group 3: row 1 gets (3 - 1) / (sqrt 2 + 1e-6)
    assert_broadcast(adv, MASK, [0.0, 2 / (math.sqrt(2) + 1e-6), 0.0, 0.0, 0.0, 0.0, 0.0])
    rewards = REWARDS.clone()
    rewards[6, 1] = 0.75  # group 10 now [1, 0, 0, .75]: row 0 gets .25 (no std normalisation)
    adv, _ = GRPOPassK(norm_by_std=False)(AdvantageInputs(rewards, MASK, group_ids=IDS))
    assert_broadcast(adv, MASK, [0.25, 2.0, 0.0, 0.0, 0.0, 0.0, 0.0])


def test_reinforce_pp_baseline_golden():
    adv, _ = ReinforcePlusPlusBaseline()(GROUP_INPUTS)
    centred = [0.5, 1.0, -0.5, 0.0, -0.5, -1.0, 0.5]  # Dr.GRPO values, whitened over all 15 tokens
    tokens = torch.tensor([c for c, n in zip(centred, LENS.tolist()) for _ in range(n)])
    expected = [(c - tokens.mean().item()) / tokens.std().item() for c in centred]
    torch.testing.assert_close(adv, torch.tensor(expected)[:, None] * MASK, atol=1e-5, rtol=1e-5)


def test_reinforce_pp_golden():
    rewards = torch.tensor([[1.0, 0.0, 2.0], [0.0, 4.0, 7.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv, ret = ReinforcePlusPlus(gamma=0.5)(AdvantageInputs(rewards, mask))
    # returns: [1 + .25*2, .5*2, 2] = [1.5, 1, 2] and [.5*4, 4] = [2, 4]
    torch.testing.assert_close(ret, torch.tensor([[1.5, 1.0, 2.0], [2.0, 4.0, 0.0]]))
    # whitened over [1.5, 1, 2, 2, 4]: mean 2.1, unbiased var 5.2 / 4 = 1.3
    s = math.sqrt(1.3)
    expected = torch.tensor([[-0.6 / s, -1.1 / s, -0.1 / s], [-0.1 / s, 1.9 / s, 0.0]])
    torch.testing.assert_close(adv, expected, atol=1e-5, rtol=1e-5)


def test_remax_golden():
    rewards = torch.tensor([[0.1, 0.0, 1.0], [0.0, 2.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv, ret = ReMax()(AdvantageInputs(rewards, mask, baseline_rewards=torch.tensor([0.5, 3.0])))
    # returns [1.1, 1, 1] and [2, 2, (masked)]; minus the greedy baselines .5 and 3
    torch.testing.assert_close(ret, torch.tensor([[1.1, 1.0, 1.0], [2.0, 2.0, 0.0]]))
    torch.testing.assert_close(adv, torch.tensor([[0.6, 0.5, 0.5], [-1.0, -1.0, 0.0]]))


def test_gae_golden_and_hole():
    # gamma .9, lam .8; r = [0, 0, 1], V = [.5, .4, .6]
    # deltas: d2 = 1 - .6 = .4; d1 = .9*.6 - .4 = .14; d0 = .9*.4 - .5 = -.14
    # A2 = .4; A1 = .14 + .72*.4 = .428; A0 = -.14 + .72*.428 = .16816; returns = A + V
    gae = GAE(gamma=0.9, lam=0.8)
    adv, ret = gae(AdvantageInputs(torch.tensor([[0.0, 0.0, 1.0]]), torch.ones(1, 3), values=torch.tensor([[0.5, 0.4, 0.6]])))
    torch.testing.assert_close(adv, torch.tensor([[0.16816, 0.428, 0.4]]))
    torch.testing.assert_close(ret, torch.tensor([[0.66816, 0.828, 1.0]]))
    # a tool-output token (mask 0) inserted at position 1 is skipped: same numbers around it
    inputs = AdvantageInputs(
        torch.tensor([[0.0, 5.0, 0.0, 1.0]]), torch.tensor([[1.0, 0.0, 1.0, 1.0]]), values=torch.tensor([[0.5, 99.0, 0.4, 0.6]])
    )
    adv, ret = gae(inputs)
    torch.testing.assert_close(adv, torch.tensor([[0.16816, 0.0, 0.428, 0.4]]))
    torch.testing.assert_close(ret, torch.tensor([[0.66816, 0.0, 0.828, 1.0]]))
    assert GAE.requires_critic and not GRPO.requires_critic


def test_otb_golden():
    # one group of two rows; w = 1 - 2 pi + sum pi^2:
    # row 0: pi = [.5, .5], sum pi^2 = [.5, .5] -> w = [.5, .5], W = [.5, 1]
    # row 1: pi = [.25, .5], sum pi^2 = [.25, .5] -> w = [.75, .5], W = [.75, 1.25]
    # returns G: row 0 [1, 1] (reward 1 on its last token), row 1 [0, 0]
    # B_0 = (1*.5 + 0) / (.5 + .75) = .4; B_1 = (1*1 + 0) / (1 + 1.25) = 4/9
    inputs = AdvantageInputs(
        token_level_rewards=torch.tensor([[0.0, 1.0], [0.0, 0.0]]),
        response_mask=torch.ones(2, 2),
        group_ids=torch.tensor([1, 1]),
        old_log_probs=torch.tensor([[0.5, 0.5], [0.25, 0.5]]).log(),
        sum_pi_squared=torch.tensor([[0.5, 0.5], [0.25, 0.5]]),
    )
    adv, ret = OptimalTokenBaseline()(inputs)
    torch.testing.assert_close(adv, torch.tensor([[0.6, 5 / 9], [-0.4, -4 / 9]]))
    torch.testing.assert_close(ret, torch.tensor([[1.0, 1.0], [0.0, 0.0]]))
    # row 1 ends after one token: at t = 1 only row 0 is valid -> zero tail: B_1 = 0, A = G = 1
    inputs.response_mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    adv, _ = OptimalTokenBaseline()(inputs)
    torch.testing.assert_close(adv, torch.tensor([[0.6, 1.0], [-0.4, 0.0]]))
    adv, _ = OptimalTokenBaseline(zero_tail=False)(inputs)  # own return as baseline -> 0
    torch.testing.assert_close(adv, torch.tensor([[0.6, 0.0], [-0.4, 0.0]]))


def test_missing_inputs_raise():
    with pytest.raises(ValueError, match="group_ids"):
        GRPO()(AdvantageInputs(REWARDS, MASK))
    with pytest.raises(ValueError, match="values"):
        GAE()(AdvantageInputs(REWARDS, MASK))
    with pytest.raises(ValueError, match="baseline_rewards"):
        ReMax()(AdvantageInputs(REWARDS, MASK))


# ------------------------------------------------------------------- group properties
OUTCOME = [GRPO(), GRPO(norm_by_std=False), RLOO(), OPO(), GPG(), GRPOPassK(), ReinforcePlusPlusBaseline()]
ZERO_SUM = [GRPO(), GRPO(norm_by_std=False), RLOO(), GPG()]


def _grouped_inputs(case, ids):
    scores = case.randn(case.B)
    return AdvantageInputs(outcome_rewards(case, scores), case.mask, group_ids=ids), scores


@settings(max_examples=100)
@given(grouped_cases())
def test_group_advantages_sum_to_zero(data):
    case, ids = data
    inputs, _ = _grouped_inputs(case, ids)
    for est in ZERO_SUM:
        seq = per_seq(est(inputs)[0], case.mask)
        for gid in torch.unique(ids):
            sel = ids == gid
            if sel.sum() > 1:
                torch.testing.assert_close(seq[sel].sum(), torch.tensor(0.0, dtype=seq.dtype), atol=1e-6 * case.scale, rtol=0)
            else:
                assert seq[sel].item() == 0.0
    adv, _ = OPO()(inputs)  # length-weighted: the token-level sum is zero
    for gid in torch.unique(ids):
        sel = ids == gid
        torch.testing.assert_close(adv[sel].sum(), torch.tensor(0.0, dtype=adv.dtype), atol=1e-6 * case.scale, rtol=0)


@settings(max_examples=100)
@given(grouped_cases(), st.integers(0, 2**31 - 1))
def test_shift_invariance_and_grpo_scale_invariance(data, seed):
    case, ids = data
    inputs, scores = _grouped_inputs(case, ids)
    g = torch.Generator().manual_seed(seed)
    uniq, inverse = torch.unique(ids, return_inverse=True)
    shift = (torch.randn(uniq.numel(), generator=g, dtype=torch.float64) * 10)[inverse]
    shifted = AdvantageInputs(outcome_rewards(case, scores + shift), case.mask, group_ids=ids)
    for est in OUTCOME:
        torch.testing.assert_close(est(shifted)[0], est(inputs)[0], atol=1e-6 * max(case.scale, 1.0), rtol=1e-5)
    k = (torch.rand(uniq.numel(), generator=g, dtype=torch.float64) * 50 + 0.5)[inverse]
    scaled = AdvantageInputs(outcome_rewards(case, scores * k), case.mask, group_ids=ids)
    a, b = GRPO()(inputs)[0], GRPO()(scaled)[0]
    spread = torch.tensor([scores[ids == i].std().item() if (ids == i).sum() > 1 else 1.0 for i in ids], dtype=torch.float64)
    ok = spread > 1e-2  # where eps = 1e-6 is negligible next to the group std
    torch.testing.assert_close(a[ok], b[ok], atol=1e-4, rtol=1e-4)


@settings(max_examples=100)
@given(grouped_cases(), st.permutations(range(8)), st.integers(0, 2**40))
def test_permutation_and_relabelling_equivariance(data, perm, salt):
    case, ids = data
    inputs, _ = _grouped_inputs(case, ids)
    p = torch.tensor([i for i in perm if i < case.B])
    permuted = AdvantageInputs(inputs.token_level_rewards[p], case.mask[p], group_ids=ids[p])
    relabelled = AdvantageInputs(inputs.token_level_rewards, case.mask, group_ids=ids * 7919 + salt)
    for est in OUTCOME:
        adv, ret = est(inputs)
        if not isinstance(est, GRPOPassK):  # pass@k breaks ties by batch position
            torch.testing.assert_close(est(permuted)[0], adv[p])
        torch.testing.assert_close(est(relabelled)[0], adv)


@settings(max_examples=100)
@given(grouped_cases(empty_rows=True, max_t=10))
def test_masked_positions_exactly_zero_and_padding_ignored(data):
    case, ids = data
    rewards, values = case.randn(), case.randn()
    inputs = AdvantageInputs(
        rewards, case.mask, group_ids=ids, values=values, baseline_rewards=case.randn(case.B),
        old_log_probs=-case.rand(), sum_pi_squared=case.rand() * 0.5 + 0.1,
    )
    noisy = AdvantageInputs(
        perturb_padding(rewards, case.mask, case.gen), case.mask, group_ids=ids,
        values=perturb_padding(values, case.mask, case.gen), baseline_rewards=inputs.baseline_rewards,
        old_log_probs=torch.where(case.mask != 0, inputs.old_log_probs, -case.rand()),
        sum_pi_squared=torch.where(case.mask != 0, inputs.sum_pi_squared, case.rand()),
    )
    estimators = [*OUTCOME, GAE(0.99, 0.95), GAE(1.0, 1.0, whiten=True), ReinforcePlusPlus(0.9), ReMax(), OptimalTokenBaseline()]
    for est in estimators:
        adv, ret = est(inputs)
        assert adv.shape == ret.shape == case.mask.shape
        assert torch.isfinite(adv).all() and torch.isfinite(ret).all(), est
        assert (adv[case.mask == 0] == 0).all() and (ret[case.mask == 0] == 0).all(), est
        adv2, ret2 = est(noisy)
        torch.testing.assert_close(adv2, adv, msg=repr(est))
        torch.testing.assert_close(ret2, ret, msg=repr(est))


@settings(max_examples=30)
@given(grouped_cases(max_b=6, empty_rows=True))
def test_passk_only_best_gets_credit(data):
    case, ids = data
    inputs, scores = _grouped_inputs(case, ids)
    seq = per_seq(GRPOPassK(norm_by_std=False)(inputs)[0], case.mask)
    for gid in torch.unique(ids):
        sel = (ids == gid).nonzero().squeeze(-1)
        s = scores[sel]
        assert (seq[sel] != 0).sum() <= 1 and (seq[sel] >= 0).all()
        if sel.numel() > 1 and (case.mask[sel].sum(-1) > 0).all():
            top2 = s.topk(2).values
            torch.testing.assert_close(seq[sel].max(), (top2[0] - top2[1]).to(seq.dtype))


def test_otb_weighted_sum_is_zero_per_position():
    g = torch.Generator().manual_seed(0)
    B, T = 6, 5
    mask = (torch.arange(T) < torch.tensor([5, 3, 4, 5, 2, 5])[:, None]).double()
    inputs = AdvantageInputs(
        torch.randn(B, T, generator=g, dtype=torch.float64) * mask, mask, group_ids=torch.tensor([0, 0, 0, 1, 1, 1]),
        old_log_probs=-torch.rand(B, T, generator=g, dtype=torch.float64),
        sum_pi_squared=torch.rand(B, T, generator=g, dtype=torch.float64) * 0.5 + 0.2,
    )
    adv, _ = OptimalTokenBaseline(zero_tail=False, eps=0.0)(inputs)
    w = 1 - 2 * inputs.old_log_probs.exp() + inputs.sum_pi_squared
    W = (w * mask).cumsum(-1) * mask
    for rows in ([0, 1, 2], [3, 4, 5]):
        torch.testing.assert_close((W[rows] * adv[rows]).sum(0), torch.zeros(T, dtype=torch.float64), atol=1e-12, rtol=0)


# --------------------------------------------------------------------------------- GAE
def verl_style_gae(rewards, values, mask, gamma, lam):
    """The per-timestep loop of verl's compute_gae_advantage_return (no whitening)."""
    B, T = rewards.shape
    next_value = torch.zeros(B, dtype=rewards.dtype)
    last = torch.zeros(B, dtype=rewards.dtype)
    out = []
    for t in reversed(range(T)):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        new = delta + gamma * lam * last
        next_value = values[:, t] * mask[:, t] + (1 - mask[:, t]) * next_value
        last = new * mask[:, t] + (1 - mask[:, t]) * last
        out.append(last)
    adv = torch.stack(out[::-1], dim=1)
    return adv * mask, (adv + values) * mask


def compressed(x, mask):
    return [x[i][mask[i] != 0].tolist() for i in range(x.shape[0])]


@settings(max_examples=100)
@given(cases(max_t=24), st.sampled_from([1.0, 0.99, 0.5]), st.sampled_from([1.0, 0.95, 0.0]))
def test_gae_matches_reference_loop(case, gamma, lam):
    rewards, values = case.randn(), case.randn()
    adv, ret = GAE(gamma, lam)(AdvantageInputs(rewards, case.mask, values=values))
    ref_adv, ref_ret = verl_style_gae(rewards, values, case.mask, gamma, lam)
    tol = 1e-9 * max(case.scale, 1.0) * case.T
    torch.testing.assert_close(adv, ref_adv, atol=tol, rtol=1e-9)
    torch.testing.assert_close(ret, ref_ret, atol=tol, rtol=1e-9)


@settings(max_examples=40)
@given(cases(max_t=16), st.sampled_from([1.0, 0.9, 0.3]))
def test_gae_lambda_limits(case, gamma):
    rewards, values = case.randn(), case.randn()
    inputs = AdvantageInputs(rewards, case.mask, values=values)
    a1, _ = GAE(gamma, 1.0)(inputs)
    a0, _ = GAE(gamma, 0.0)(inputs)
    for i, (r, v) in enumerate(zip(compressed(rewards, case.mask), compressed(values, case.mask))):
        n = len(r)
        ret = [sum(gamma ** (k - t) * r[k] for k in range(t, n)) for t in range(n)]  # discounted return
        td = [r[t] + gamma * (v[t + 1] if t + 1 < n else 0.0) - v[t] for t in range(n)]  # one-step TD error
        valid = case.mask[i] != 0
        tol = 1e-9 * max(case.scale, 1.0) * case.T
        torch.testing.assert_close(a1[i][valid], torch.tensor(ret, dtype=a1.dtype) - torch.tensor(v, dtype=a1.dtype), atol=tol, rtol=1e-9)
        torch.testing.assert_close(a0[i][valid], torch.tensor(td, dtype=a0.dtype), atol=tol, rtol=1e-9)


@settings(max_examples=100)
@given(cases(max_t=12, holes=False), st.data())
def test_gae_inserting_masked_positions_changes_nothing_else(case, data):
    rewards, values = case.randn(), case.randn()
    T = case.T
    n_insert = data.draw(st.integers(1, 6))
    where = sorted(data.draw(st.lists(st.integers(0, T), min_size=n_insert, max_size=n_insert)))
    # build the widened layout: original column j moves right by the inserts before it
    cols, inserted = [], []
    k = 0
    for j in range(T + 1):
        while k < len(where) and where[k] == j:
            inserted.append(len(cols) + len(inserted))
            k += 1
        if j < T:
            cols.append(j + len(inserted))
    W = T + n_insert
    def widen(x, fill):
        out = fill.clone()
        out[:, cols] = x
        return out
    noise = lambda: torch.randn(case.B, W, generator=case.gen, dtype=torch.float64) * 100  # noqa: E731
    wide_mask = widen(case.mask, torch.zeros(case.B, W, dtype=torch.float64))
    gae = GAE(gamma=0.97, lam=0.9)
    adv, ret = gae(AdvantageInputs(rewards, case.mask, values=values))
    wide_adv, wide_ret = gae(AdvantageInputs(widen(rewards, noise()), wide_mask, values=widen(values, noise())))
    torch.testing.assert_close(wide_adv[:, cols], adv)
    torch.testing.assert_close(wide_ret[:, cols], ret)
    assert (wide_adv[:, inserted] == 0).all()


def test_gae_whiten_and_float32():
    g = torch.Generator().manual_seed(0)
    mask = (torch.arange(50) < torch.randint(1, 51, (16,), generator=g)[:, None]).float()
    inputs = AdvantageInputs(torch.randn(16, 50, generator=g), mask, values=torch.randn(16, 50, generator=g))
    adv, ret = GAE(0.99, 0.95, whiten=True)(inputs)
    raw, ret_raw = GAE(0.99, 0.95)(inputs)
    assert adv.dtype == torch.float32
    torch.testing.assert_close(ret, ret_raw)  # returns are taken before whitening
    sel = adv[mask.bool()]
    assert abs(sel.mean().item()) < 1e-5 and abs(sel.std().item() - 1) < 1e-4
    ref_adv, _ = verl_style_gae(inputs.token_level_rewards, inputs.values, mask, 0.99, 0.95)
    torch.testing.assert_close(raw, ref_adv, atol=1e-4, rtol=1e-4)
