"""Reverse discounted sums over time, vectorised over the batch.

Notation: B batch, T response tokens. Linear recurrences of the form

    y_t = x_t + d * y_{t+1},   y_T = 0          (i.e. y_t = sum_{k >= t} d^{k-t} x_k)

are the core of GAE and of discounted returns. A per-timestep Python loop costs T kernel
launches of size B. Here T is cut into chunks of C steps: inside a chunk the sum is one
(C, C) upper-triangular matmul shared by every row (BLAS), and the chunk boundaries are
linked by a second (n, n) matmul over the n = T / C chunk starts. Two matmuls, no loop.

Masks with holes (mask-0 positions inside a response, e.g. tool output) are handled by
`Packing`: the valid tokens of every row are moved to the front (a scatter), the dense
recurrence runs on that, and results are gathered back. A masked position is therefore
transparent: it neither adds its x nor consumes a discount step.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

DEFAULT_CHUNK = 64  # steps per chunk: the (C, C) matmul costs B*T*C multiply-adds
_TINY = 1e-30  # powers below this are flushed to 0 (avoids denormals in the matmuls)


def _powers(discount: float, exponents: Tensor) -> Tensor:
    """discount ** e for e >= 0 (0 where e < 0), in float64, tiny values flushed to 0."""
    e = exponents.to(torch.float64)
    p = torch.where(e >= 0, torch.pow(torch.tensor(discount, dtype=torch.float64), e.clamp_min(0)), 0.0)
    return torch.where(p < _TINY, 0.0, p)


def reverse_discounted_cumsum(x: Tensor, discount: float, chunk_size: int = DEFAULT_CHUNK) -> Tensor:
    """y_t = sum_{k >= t} discount^{k - t} x_k along the last dim of x (B, T); returns (B, T).

    discount: in [0, 1]. chunk_size: steps per chunk (see module docstring). Every position
    counts (no mask); see `masked_reverse_discounted_cumsum` for masks. Trailing zeros of x
    give exactly-zero outputs.
    """
    if not 0.0 <= discount <= 1.0:
        raise ValueError(f"discount must be in [0, 1], got {discount}")
    B, T = x.shape
    if T == 0:
        return x.clone()
    if discount == 1.0:  # plain reverse cumulative sum
        return x.flip(-1).cumsum(-1).flip(-1)
    C = min(chunk_size, T)
    n = math.ceil(T / C)
    X = (x if n * C == T else F.pad(x, (0, n * C - T))).reshape(B, n, C)
    j = torch.arange(C, device=x.device)
    # within-chunk: local[b, c, i] = sum_{k >= i} d^(k - i) X[b, c, k]
    L = _powers(discount, j[:, None] - j[None, :]).to(x.dtype)
    local = X @ L
    if n > 1:
        # chunk starts: S_c = local[c, 0] + d^C S_{c+1}  ->  S = local[:, :, 0] @ M
        c = torch.arange(n, device=x.device)
        M = _powers(discount**C, c[:, None] - c[None, :]).to(x.dtype)
        starts = local[:, :, 0] @ M
        next_start = F.pad(starts[:, 1:], (0, 1))
        tail = _powers(discount, C - j).to(x.dtype)  # d^(C - i): how S_{c+1} reaches position i
        local.addcmul_(next_start.unsqueeze(-1), tail)
    out = local.view(B, n * C)
    return out if n * C == T else out[:, :T]


def is_prefix_mask(mask: Tensor) -> bool:
    """True when every row of the 0/1 mask (B, T) is 1...1 0...0 (valid tokens first, no holes).

    Cheap exact test: the L valid positions of a row sum to at least 0 + 1 + ... + (L-1),
    with equality only for {0, ..., L-1}.
    """
    T = mask.shape[-1]
    if T <= 1:
        return True
    m = mask.to(torch.float64 if T > 4096 else torch.float32)
    n = m.sum(-1)
    pos_sum = m @ torch.arange(T, dtype=m.dtype, device=m.device)
    return bool(torch.equal(pos_sum, n * (n - 1) / 2))


class Packing:
    """Move the valid tokens of each row of a 0/1 mask (B, T) to the front, and back.

    `pack(x)`: (B, T) -> (B, T) with row i's valid values at positions 0..len_i-1 (in order)
    and zeros after. `unpack(y)`: the inverse, 0 at masked positions; it assumes y is 0 past
    each row's length (the recurrences keep it so). When every row is already a prefix
    (1...1 0...0, the usual right padding) pack is a masked copy and unpack the identity.
    `weight` is the mask in the compute dtype.
    """

    def __init__(self, mask: Tensor, dtype: torch.dtype = torch.float32):
        self.weight = mask.to(dtype)
        self.is_prefix = is_prefix_mask(self.weight)
        if not self.is_prefix:
            T = mask.shape[-1]
            # packed position (valid tokens up to here, minus 1) for valid tokens and T (an
            # extra, dropped column) for masked ones; computed in float, cast once.
            target = self.weight.cumsum(-1).sub_(1 + T).mul_(self.weight).add_(T)
            self.target = target.to(torch.int64)

    def pack(self, x: Tensor) -> Tensor:
        if self.is_prefix:
            return x * self.weight
        out = x.new_zeros(x.shape[0], x.shape[1] + 1)  # masked values land in the last column
        return out.scatter_(1, self.target, x)[:, :-1]

    def unpack(self, y: Tensor) -> Tensor:
        if self.is_prefix:
            return y
        return F.pad(y, (0, 1)).gather(1, self.target)  # masked positions read the zero column


def masked_reverse_discounted_cumsum(
    x: Tensor, mask: Tensor, discount: float, chunk_size: int = DEFAULT_CHUNK
) -> Tensor:
    """y_t = sum over valid k >= t of discount^{n(t, k)} x_k, where n(t, k) counts the valid
    positions in (t, k]; masked x are ignored and masked outputs are 0.

    x: (B, T) finite; mask: (B, T) 0/1. Returns (B, T) in x's dtype (at least float32).
    Masked positions inside a row are skipped (transparent).
    """
    dtype = torch.promote_types(x.dtype, torch.float32)
    if discount == 1.0:  # the exponent does not matter: no packing needed
        w = mask.to(dtype)
        return (x * w).flip(-1).cumsum(-1).flip(-1).mul_(w)
    packing = Packing(mask, dtype)
    return packing.unpack(reverse_discounted_cumsum(packing.pack(x.to(dtype)), discount, chunk_size))
