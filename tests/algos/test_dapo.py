"""rlhf.algos.dapo and rlhf.algos.pf_ppo."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhf.algos.dapo import DynamicSamplingAccumulator, groups_with_variance, overlong_penalty
from rlhf.algos.pf_ppo import MaxMinWeights, MaxRandomWeights, PowWeights, pf_ppo_resample

from .strategies import grouped_cases


def test_overlong_penalty_golden():
    # L_max 20, buffer 4 -> ramp from 16: |y| = 10 -> 0; 16 -> 0; 18 -> -(2/4) * 0.5; 20 -> -0.5; 25 -> -0.5
    lengths = torch.tensor([10, 16, 18, 20, 25])
    out = overlong_penalty(lengths, max_new_tokens=20, overlong_buffer_len=4, penalty_factor=0.5)
    torch.testing.assert_close(out, torch.tensor([0.0, 0.0, -0.25, -0.5, -0.5]))
    with pytest.raises(ValueError):
        overlong_penalty(lengths, 20, 0)


def test_overlong_penalty_hand_computed():
    # Lmax = 20, Lbuf = 8: no penalty up to 12 tokens, then -(L - 12) / 8, -1 from 20 on.
    penalties = overlong_penalty(torch.tensor([0, 12, 13, 16, 19, 20, 25]), 20, 8, penalty_factor=1.0)
    assert penalties.tolist() == [0.0, 0.0, -0.125, -0.5, -0.875, -1.0, -1.0]


@given(
    lengths=st.lists(st.integers(0, 300), max_size=20),
    max_len=st.integers(1, 256),
    frac=st.floats(0.01, 1.0),
    factor=st.floats(0.0, 4.0),
)
def test_overlong_penalty_properties(lengths, max_len, frac, factor):
    buffer = max(1, int(max_len * frac))
    penalties = overlong_penalty(torch.tensor(lengths, dtype=torch.long), max_len, buffer, factor).tolist()
    assert all(-factor * (1 + 1e-6) <= p <= 0.0 for p in penalties)
    ordered = sorted(zip(lengths, penalties))
    assert all(a[1] >= b[1] for a, b in zip(ordered, ordered[1:]))  # longer never scores better
    assert all(p == 0.0 for n, p in zip(lengths, penalties) if n <= max_len - buffer)


def test_groups_with_variance_golden():
    ids = torch.tensor([4, 4, 9, 9, 9, 1])
    scores = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 5.0])
    # group 4 all equal -> out; group 9 has spread -> in; singleton 1 -> out
    assert groups_with_variance(ids, scores).tolist() == [False, False, True, True, True, False]


@settings(max_examples=30)
@given(grouped_cases())
def test_groups_with_variance_matches_loop(data):
    case, ids = data
    scores = torch.randint(0, 2, (case.B,), generator=case.gen).double()
    keep = groups_with_variance(ids, scores)
    for i in range(case.B):
        assert keep[i] == (scores[ids == ids[i]].unique().numel() > 1)


def test_accumulator_collects_trims_and_caps():
    acc = DynamicSamplingAccumulator(target_num_groups=3, max_attempts=3)
    # round 1: groups 0 (spread) and 1 (no spread)
    r1 = {"x": torch.tensor([0.0, 1.0, 2.0, 3.0])}
    assert acc.add(r1, torch.tensor([0, 0, 1, 1]), torch.tensor([0.0, 1.0, 1.0, 1.0])) == 1
    assert not acc.ready
    # round 2: three groups with spread; only two are needed
    r2 = {"x": torch.tensor([10.0, 11.0, 12.0, 13.0, 14.0, 15.0])}
    assert acc.add(r2, torch.tensor([7, 5, 7, 5, 6, 6]), torch.tensor([0.0, 0.0, 1.0, 1.0, 0.0, 1.0])) == 3
    assert acc.done and acc.ready and acc.num_groups == 4
    out = acc.result()
    # round 1 rows 0, 1 (group 0); round 2: groups 7 and 5 (first seen), not 6
    assert out["x"].tolist() == [0.0, 1.0, 10.0, 11.0, 12.0, 13.0]

    acc = DynamicSamplingAccumulator(target_num_groups=2, max_attempts=2)
    flat = torch.tensor([1.0, 1.0])
    acc.add(torch.tensor([1.0, 2.0]), torch.tensor([0, 0]), flat)
    acc.add(torch.tensor([3.0, 4.0]), torch.tensor([0, 0]), torch.tensor([0.0, 1.0]))
    assert acc.ready and not acc.done
    with pytest.raises(RuntimeError):
        acc.add(torch.tensor([5.0, 6.0]), torch.tensor([0, 0]), flat)
    with pytest.raises(RuntimeError):
        acc.result()
    assert acc.result(allow_partial=True).tolist() == [3.0, 4.0]
    acc.reset()
    assert acc.attempts == 0 and acc.result(allow_partial=True) is None


def test_pf_ppo_weights_golden():
    scores = torch.tensor([-2.0, 0.5, 1.0, 3.0])
    torch.testing.assert_close(PowWeights(2.0)(scores), torch.tensor([4.0, 0.25, 1.0, 9.0]))
    torch.testing.assert_close(MaxMinWeights()(scores), torch.tensor([1.0, 0.0, 0.0, 1.0]))
    torch.testing.assert_close(MaxRandomWeights()(scores), torch.tensor([0.1, 0.1, 0.1, 0.4]))


def test_pf_ppo_resample_follows_the_weights():
    scores = torch.tensor([-2.0, 0.0, 1.0, 3.0])
    rows = pf_ppo_resample(scores, PowWeights(2.0), num_samples=70_000, generator=torch.Generator().manual_seed(0))
    freq = torch.bincount(rows, minlength=4).double() / rows.numel()
    # weights [4, 0, 1, 9] (+1e-8) -> probabilities [4, 0, 1, 9] / 14
    torch.testing.assert_close(freq, torch.tensor([4 / 14, 0.0, 1 / 14, 9 / 14], dtype=torch.float64), atol=0.01, rtol=0)
    assert pf_ppo_resample(scores, MaxMinWeights()).shape == (4,)
