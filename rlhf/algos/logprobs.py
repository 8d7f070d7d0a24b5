"""Token log-probabilities and entropies from logits, frugal with memory.

Notation: B batch, T tokens, V vocabulary. `logits` is (B, T, V) (any leading shape
works: everything but the last dim is flattened into rows), `labels` is (B, T) int64.

A full `log_softmax` materialises a second (B, T, V) tensor and keeps it alive for
backward. The functions here instead compute `logsumexp` row-chunk by row-chunk (in
float32 for low-precision logits), save only the (B, T) statistics, and recompute the
softmax chunk by chunk in backward. Peak extra memory is one (chunk_size, V) float32
block plus the (B, T, V) gradient that autograd has to produce anyway.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _rows(x: Tensor) -> Tensor:
    return x.reshape(-1, x.shape[-1])


CHUNK_ELEMENTS = 2**19  # default block: ~2 MiB of float32, small enough to stay in cache


def _chunk_rows(chunk_size: int | None, vocab: int) -> int:
    return max(1, CHUNK_ELEMENTS // max(vocab, 1)) if chunk_size is None else chunk_size


class _SelectedLogProb(torch.autograd.Function):
    """log p(label) = z_label - logsumexp(z); backward recomputes softmax per chunk."""

    @staticmethod
    def forward(ctx, logits: Tensor, labels: Tensor, chunk_size: int) -> Tensor:
        z = _rows(logits)
        y = labels.reshape(-1)
        cdt = _compute_dtype(logits.dtype)
        lse = torch.empty(z.shape[0], dtype=cdt, device=z.device)
        for start in range(0, z.shape[0], chunk_size):
            lse[start : start + chunk_size] = torch.logsumexp(z[start : start + chunk_size].to(cdt), dim=-1)
        picked = z.gather(-1, y.unsqueeze(-1)).squeeze(-1).to(cdt)
        ctx.save_for_backward(logits, labels, lse)
        ctx.chunk_size = chunk_size
        return (picked - lse).reshape(labels.shape)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: Tensor):
        logits, labels, lse = ctx.saved_tensors
        z = _rows(logits)
        y = labels.reshape(-1)
        g = grad_out.reshape(-1).to(lse.dtype)
        grad = torch.empty_like(z)
        cs = ctx.chunk_size
        for start in range(0, z.shape[0], cs):
            sl = slice(start, start + cs)
            # d/dz_v [z_y - lse] = 1[v = y] - softmax(z)_v
            p = torch.sub(z[sl].to(lse.dtype), lse[sl, None]).exp_()
            p.mul_(-g[sl, None])
            p.scatter_add_(-1, y[sl, None], g[sl, None])
            grad[sl] = p.to(z.dtype)
        return grad.reshape(logits.shape), None, None


class _ChunkedEntropy(torch.autograd.Function):
    """H = logsumexp(z) - sum_v p_v z_v; dH/dz_v = -p_v (z_v - E_p[z])."""

    @staticmethod
    def forward(ctx, logits: Tensor, chunk_size: int) -> Tensor:
        z = _rows(logits)
        cdt = _compute_dtype(logits.dtype)
        ent = torch.empty(z.shape[0], dtype=cdt, device=z.device)
        for start in range(0, z.shape[0], chunk_size):
            zc = z[start : start + chunk_size].to(cdt)
            lse = torch.logsumexp(zc, dim=-1, keepdim=True)
            p = torch.exp(zc - lse)
            ent[start : start + chunk_size] = lse.squeeze(-1) - (p * zc).sum(-1)
        ctx.save_for_backward(logits)
        ctx.chunk_size = chunk_size
        return ent.reshape(logits.shape[:-1])

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: Tensor):
        (logits,) = ctx.saved_tensors
        z = _rows(logits)
        cdt = _compute_dtype(logits.dtype)
        g = grad_out.reshape(-1).to(cdt)
        grad = torch.empty_like(z)
        cs = ctx.chunk_size
        for start in range(0, z.shape[0], cs):
            sl = slice(start, start + cs)
            zc = z[sl].to(cdt)
            p = torch.softmax(zc, dim=-1)
            mean_z = (p * zc).sum(-1, keepdim=True)
            grad[sl] = (-(p * (zc - mean_z)) * g[sl, None]).to(z.dtype)
        return grad.reshape(logits.shape), None


def log_probs_from_logits(logits: Tensor, labels: Tensor, *, chunk_size: int | None = None) -> Tensor:
    """log pi(y_t | y_<t) = z_{t, y_t} - logsumexp_v z_{t, v}.

    logits: (B, T, V) any float dtype; labels: (B, T) int64 token ids.
    chunk_size: rows (tokens) per block, bounding the float32 temporaries to chunk_size x V;
        None picks about 2^19 elements per block (measured fastest on CPU: it stays in cache).
    Returns (B, T) log-probabilities in float32 (float64 for float64 logits), differentiable
    w.r.t. logits without keeping a (B, T, V) log-softmax copy for backward.
    """
    return _SelectedLogProb.apply(logits, labels, _chunk_rows(chunk_size, logits.shape[-1]))


def entropy_from_logits(logits: Tensor) -> Tensor:
    """H(pi_t) = logsumexp_v z_v - sum_v softmax(z)_v z_v, per token.

    logits: (B, T, V). Returns (B, T) in the logits' dtype. Plain autograd: keeps the
    softmax for backward; use `entropy_from_logits_chunked` for large vocabularies.
    """
    p = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (p * logits).sum(-1)


def entropy_from_logits_chunked(logits: Tensor, chunk_size: int | None = None) -> Tensor:
    """Same value as `entropy_from_logits`, computed chunk_size rows at a time in float32.

    logits: (B, T, V). chunk_size: tokens per block (bounds the temporaries to chunk_size x V;
        None picks about 2^19 elements per block).
    Returns (B, T) float32 (float64 for float64 logits). Backward recomputes the softmax
    per chunk: dH/dz_v = -p_v (z_v - sum_u p_u z_u), so nothing (B, T, V) is saved.
    """
    return _ChunkedEntropy.apply(logits, _chunk_rows(chunk_size, logits.shape[-1]))


def sum_pi_squared_from_logits(logits: Tensor) -> Tensor:
    """sum_v pi_v^2 = exp(logsumexp(2 z) - 2 logsumexp(z)) per token (no grad).

    logits: (B, T, V). Returns (B, T) float32. Input of the optimal token baseline
    (`advantages.OptimalTokenBaseline`): ||d log pi_y / dz||^2 = 1 - 2 pi_y + sum_v pi_v^2.
    """
    with torch.no_grad():
        z = logits.to(_compute_dtype(logits.dtype))
        return torch.exp(torch.logsumexp(2 * z, dim=-1) - 2 * torch.logsumexp(z, dim=-1))
