"""Masked reductions over token tensors.

Notation: B batch (responses), T response tokens. A `mask` is (B, T) (or any shape
matching `x`), 0/1 as bool or a number: 1 marks a valid token, 0 marks padding (or a
token that must not count, e.g. a tool-output token). Masked positions never
leak into a result: their values are selected away with `torch.where` before any
arithmetic, so even NaN or Inf padding changes nothing, and their gradient is exactly 0.
An empty selection (all-zero mask) gives 0, never NaN.
"""

from __future__ import annotations

import torch
from torch import Tensor


def as_bool(mask: Tensor) -> Tensor:
    """The mask as a bool tensor (nonzero = valid); no copy when it already is one."""
    return mask if mask.dtype == torch.bool else mask.bool()


def _select(x: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    valid = as_bool(mask)
    return torch.where(valid, x, torch.zeros((), dtype=x.dtype, device=x.device)), valid


def count(mask: Tensor, dim: int | None = None) -> Tensor:
    """Number of valid positions of a 0/1 mask, overall or along `dim`, as a float tensor.

    (Summing a float mask is several times faster on CPU than reducing a bool one.)
    """
    if mask.dtype in (torch.float32, torch.float64):
        return mask.sum() if dim is None else mask.sum(dim)
    if dim is None:
        return as_bool(mask).count_nonzero().to(torch.float32)
    return mask.to(torch.float32).sum(dim)


def masked_zero(x: Tensor, mask: Tensor) -> Tensor:
    """x with every masked position set to exactly 0 (value and gradient). Same shape as x."""
    return _select(x, mask)[0]


def masked_sum(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """sum_{mask != 0} x, over all elements (dim=None) or along `dim`.

    x: any shape; mask: same shape. Returns a scalar, or x's shape without `dim`.
    """
    xs, _ = _select(x, mask)
    return xs.sum() if dim is None else xs.sum(dim)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """(sum_{mask != 0} x) / #{mask != 0}; 0 where nothing is selected (never NaN).

    x: any shape; mask: same shape. Returns a scalar, or x's shape without `dim`.
    """
    xs, _ = _select(x, mask)
    s = xs.sum() if dim is None else xs.sum(dim)
    return s / count(mask, dim).to(s.dtype).clamp_min(1)


def masked_var(x: Tensor, mask: Tensor, unbiased: bool = True) -> Tensor:
    """Variance of the selected elements of x (all of them, one scalar).

    var = sum_{mask} (x - mean)^2 / (n - 1) with `unbiased` (Bessel), else / n, where n is
    the number of selected elements. Returns 0 when n <= 1 (a single value has no spread).
    """
    mean = masked_mean(x, mask)
    xs, _ = _select(x - mean, mask)
    n = count(mask).to(xs.dtype)
    denom = (n - 1) if unbiased else n
    return (xs * xs).sum() / denom.clamp_min(1)


def masked_max(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """max_{mask != 0} x over all elements or along `dim`; 0 where nothing is selected."""
    valid = as_bool(mask)
    neg_inf = torch.full((), float("-inf"), dtype=x.dtype, device=x.device)
    filled = torch.where(valid, x, neg_inf)
    out = filled.amax() if dim is None else filled.amax(dim)
    has_any = valid.any() if dim is None else valid.any(dim)
    return torch.where(has_any, out, torch.zeros((), dtype=x.dtype, device=x.device))


def masked_whiten(x: Tensor, mask: Tensor, shift_mean: bool = True, eps: float = 1e-8) -> Tensor:
    """Whiten x over its selected elements: (x - mean) / sqrt(var + eps).

    mean and (unbiased) var are taken over all selected elements of the whole tensor
    (batch whitening, as in PPO implementations since OpenAI baselines).
    shift_mean: if False the mean is added back, so only the scale changes.
    eps: added to the variance, keeps constant inputs finite.
    Returns x's shape with masked positions exactly 0.
    """
    x = masked_zero(x, mask)  # padding must not reach the product below (0 * inf = nan in backward)
    mean = masked_mean(x, mask)
    var = masked_var(x, mask, unbiased=True)
    out = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return masked_zero(out, mask)
