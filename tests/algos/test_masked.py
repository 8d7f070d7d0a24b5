"""rlhf.algos.masked: hand-computed values and padding/NaN properties."""

import math

import torch
from hypothesis import given, settings

from rlhf.algos.masked import masked_max, masked_mean, masked_sum, masked_var, masked_whiten, masked_zero

from .strategies import cases, perturb_padding

X = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
M = torch.tensor([[1.0, 1.0, 0.0], [0.0, 1.0, 0.0]])


def test_golden_sum_mean():
    # selected: 1, 2, 5 -> sum 8, mean 8/3; per row: [1+2, 5] = [3, 5], means [1.5, 5]
    assert masked_sum(X, M).item() == 8.0
    assert math.isclose(masked_mean(X, M).item(), 8 / 3, rel_tol=1e-6)
    assert masked_sum(X, M, dim=-1).tolist() == [3.0, 5.0]
    assert masked_mean(X, M, dim=-1).tolist() == [1.5, 5.0]
    assert masked_max(X, M, dim=-1).tolist() == [2.0, 5.0]


def test_golden_var_whiten():
    # selected 1, 2, 5: mean 8/3; squared deviations 25/9 + 4/9 + 49/9 = 78/9
    # unbiased var = 78/9 / 2 = 13/3; biased = 78/27 = 26/9
    assert math.isclose(masked_var(X, M).item(), 13 / 3, rel_tol=1e-6)
    assert math.isclose(masked_var(X, M, unbiased=False).item(), 26 / 9, rel_tol=1e-6)
    w = masked_whiten(X, M, eps=0.0)
    # (1 - 8/3) / sqrt(13/3) = -0.800641
    assert math.isclose(w[0, 0].item(), (1 - 8 / 3) / math.sqrt(13 / 3), rel_tol=1e-5)
    assert w[0, 2].item() == 0.0 and w[1, 0].item() == 0.0
    w_noshift = masked_whiten(X, M, shift_mean=False, eps=0.0)
    # scale only: (1 - 8/3) / sqrt(13/3) + 8/3
    assert math.isclose(w_noshift[0, 0].item(), (1 - 8 / 3) / math.sqrt(13 / 3) + 8 / 3, rel_tol=1e-5)


def test_empty_mask_is_zero_not_nan():
    z = torch.zeros_like(M)
    assert masked_sum(X, z).item() == 0.0
    assert masked_mean(X, z).item() == 0.0
    assert masked_mean(X, z, dim=-1).tolist() == [0.0, 0.0]
    assert masked_var(X, z).item() == 0.0
    assert masked_max(X, z).item() == 0.0
    assert torch.equal(masked_whiten(X, z), torch.zeros_like(X))
    # a single element: no spread
    one = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    assert masked_var(X, one).item() == 0.0
    assert torch.isfinite(masked_whiten(X, one)).all()


def test_nan_padding_does_not_leak_into_value_or_gradient():
    x = X.clone()
    x[0, 2] = float("nan")
    x[1, 0] = float("inf")
    x.requires_grad_(True)
    out = masked_mean(x, M) + masked_sum(x, M, dim=-1).sum() + masked_whiten(x, M).sum() + masked_var(x, M)
    assert torch.isfinite(out)
    out.backward()
    assert torch.isfinite(x.grad).all()
    assert x.grad[0, 2] == 0 and x.grad[1, 0] == 0 and x.grad[1, 2] == 0


def test_bool_and_float_masks_agree():
    assert masked_mean(X, M.bool()).item() == masked_mean(X, M).item()
    assert torch.equal(masked_zero(X, M.bool()), masked_zero(X, M))


@settings(max_examples=40)
@given(cases())
def test_matches_selection_and_ignores_padding(case):
    x = case.randn()
    sel = x[case.mask.bool()]
    n = sel.numel()
    torch.testing.assert_close(masked_sum(x, case.mask), sel.sum())
    torch.testing.assert_close(masked_mean(x, case.mask), sel.mean() if n else torch.tensor(0.0, dtype=x.dtype))
    if n > 1:
        torch.testing.assert_close(masked_var(x, case.mask), sel.var())
        w = masked_whiten(x, case.mask)[case.mask.bool()]
        if sel.var() > 1e-4:  # eps = 1e-8 in the variance is then negligible
            torch.testing.assert_close(w.mean(), torch.tensor(0.0, dtype=x.dtype), atol=1e-6, rtol=0)
            torch.testing.assert_close(w.var(), torch.tensor(1.0, dtype=x.dtype), atol=1e-4, rtol=0)
    y = perturb_padding(x, case.mask, case.gen)
    for fn in (masked_sum, masked_mean, masked_max):
        assert torch.equal(fn(x, case.mask), fn(y, case.mask))
        assert torch.equal(fn(x, case.mask, dim=-1), fn(y, case.mask, dim=-1))
    assert torch.equal(masked_var(x, case.mask), masked_var(y, case.mask))
    assert torch.equal(masked_whiten(x, case.mask), masked_whiten(y, case.mask))
