"""Token log-probabilities and entropies from logits in float32, without launch storms or copies.

Notation: N rows (tokens), V vocabulary; `logits` is (B, T, V) (any leading shape works:
everything but the last dim is flattened into N rows), `labels` is (B, T) int64.

A full `log_softmax` keeps a second (B, T, V) tensor alive for backward, and `logits.float()`
of bf16 logits is a (B, T, V) float32 copy: at a 152k vocabulary that is 600 KB per token.
Here the rows are processed in blocks: each block is cast to float32 and divided by the
temperature, `logsumexp` and the picked logit (and, if asked, the entropy) are computed from
it, and only the (N,) statistics are saved; backward recomputes the softmax block by block.
The largest float32 temporary is one block.

Block size: a memory budget (`max_block_elements`, default 2**24 float32 elements = 64 MiB on
a CPU, ~110 rows at 152k; 2**28 = 1 GiB on a GPU, ~1,770 rows) and at most a quarter of the rows, so
no block is ever as large as the input. The number of blocks -- hence of kernel launches --
is at most max(4, N*V / budget): it does not grow with N until the budget binds, and then
every launch moves tens of MB. (An older rule, 2**19 elements tuned for a CPU cache, meant 3
rows per block at 152k: 87,408 `logsumexp` launches per update on an H100.)
"""

from __future__ import annotations

import torch
from torch import Tensor

MAX_BLOCK_ELEMENTS = 2**24  # float32 elements per block (64 MiB): the temporaries' memory budget on a CPU
MAX_BLOCK_ELEMENTS_GPU = 2**28  # 1 GiB: ~1,770 rows at 152k, a few launches per micro-batch on a GPU
MIN_BLOCKS = 4  # blocks per call at least, so a block's float32 copy is <= 1/4 of the logits


def block_rows(rows: int, vocab: int, max_block_elements: int = MAX_BLOCK_ELEMENTS) -> int:
    """Rows per block: within the memory budget, and at most ceil(rows / MIN_BLOCKS)."""
    by_budget = max(1, max_block_elements // max(vocab, 1))
    return max(1, min(by_budget, -(-rows // MIN_BLOCKS)))


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _scaled_block(z: Tensor, inv_temperature: float, cdt: torch.dtype) -> Tensor:
    """One block of logits in `cdt` divided by the temperature (a view of `z` when nothing changes:
    never write to it)."""
    zc = z.to(cdt)
    return zc if inv_temperature == 1.0 else (zc.mul_(inv_temperature) if zc is not z else zc * inv_temperature)


class _LogProbEntropy(torch.autograd.Function):
    """lp = z_y - lse(z), H = lse(z) - E_p[z] with z = logits / tau, in blocks; backward recomputes p.

    d lp / dz_v = 1[v = y] - p_v;  d H / dz_v = -p_v (z_v - E_p[z]), and E_p[z] = lse - H.
    """

    @staticmethod
    def forward(ctx, logits: Tensor, labels: Tensor, temperature: float, rows: int, with_entropy: bool):
        z = logits.reshape(-1, logits.shape[-1])
        y = labels.reshape(-1, 1)
        cdt = _compute_dtype(logits.dtype)
        inv_t = 1.0 / temperature
        n = z.shape[0]
        lse = torch.empty(n, dtype=cdt, device=z.device)
        log_probs = torch.empty(n, dtype=cdt, device=z.device)
        entropy = torch.empty(n, dtype=cdt, device=z.device) if with_entropy else None
        for start in range(0, n, rows):
            sl = slice(start, start + rows)
            zc = _scaled_block(z[sl], inv_t, cdt)
            block_lse = torch.logsumexp(zc, dim=-1, out=lse[sl])
            torch.sub(zc.gather(-1, y[sl]).squeeze(-1), block_lse, out=log_probs[sl])
            if entropy is not None:  # H = lse - sum_v p_v z_v, p = exp(z - lse)
                p = torch.sub(zc, block_lse[:, None]).exp_()
                torch.sub(block_lse, p.mul_(zc).sum(-1), out=entropy[sl])
        ctx.save_for_backward(logits, labels, lse, entropy if entropy is not None else lse)
        ctx.inv_t, ctx.rows, ctx.with_entropy = inv_t, rows, with_entropy
        ctx.set_materialize_grads(False)  # an unused (detached) entropy costs nothing in backward
        shape = labels.shape
        return log_probs.reshape(shape), (entropy.reshape(shape) if entropy is not None else None)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_lp: Tensor | None, grad_h: Tensor | None):
        logits, labels, lse, entropy = ctx.saved_tensors
        if not ctx.with_entropy:
            grad_h = None
        z = logits.reshape(-1, logits.shape[-1])
        y = labels.reshape(-1, 1)
        cdt, inv_t, rows = lse.dtype, ctx.inv_t, ctx.rows
        g_lp = grad_lp.reshape(-1).to(cdt) if grad_lp is not None else torch.zeros_like(lse)
        g_h = grad_h.reshape(-1).to(cdt) if grad_h is not None else None
        grad = torch.empty_like(z)
        for start in range(0, z.shape[0], rows):
            sl = slice(start, start + rows)
            zc = _scaled_block(z[sl], inv_t, cdt)
            p = torch.sub(zc, lse[sl, None]).exp_()
            if g_h is None:  # -p g_lp
                weight = p.mul_(-g_lp[sl, None])
            else:  # -p (g_lp + g_h (z - E_p z))
                centered = torch.sub(zc, (lse[sl] - entropy[sl])[:, None])
                weight = p.mul_(centered.mul_(g_h[sl, None]).add_(g_lp[sl, None])).neg_()
            weight.scatter_add_(-1, y[sl], g_lp[sl, None])
            if inv_t != 1.0:
                weight.mul_(inv_t)
            grad[sl] = weight
        return grad.reshape(logits.shape), None, None, None, None


def default_block_elements(device: torch.device) -> int:
    """The float32 temporaries' budget on `device`: small on a CPU (cache), large on a GPU (launches)."""
    return MAX_BLOCK_ELEMENTS_GPU if torch.device(device).type == "cuda" else MAX_BLOCK_ELEMENTS


def log_probs_and_entropy(
    logits: Tensor,
    labels: Tensor,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    max_block_elements: int | None = None,  # None: default_block_elements(logits.device)
) -> tuple[Tensor, Tensor | None]:
    """log pi(y_t) and H(pi_t) per token, pi = softmax(logits / temperature), in one blocked pass.

    logits: (B, T, V) any float dtype (bf16 logits are never copied whole to float32);
    labels: (B, T) int64. Returns ((B, T) log-probs, (B, T) entropy or None), float32
    (float64 for float64 logits), both differentiable w.r.t. logits; detach the entropy
    to use it as a metric only (its backward then costs nothing extra).
    """
    budget = max_block_elements or default_block_elements(logits.device)
    rows = block_rows(labels.numel(), logits.shape[-1], budget)
    return _LogProbEntropy.apply(logits, labels, float(temperature), rows, with_entropy)


def log_probs_from_logits(
    logits: Tensor, labels: Tensor, *, temperature: float = 1.0, chunk_size: int | None = None
) -> Tensor:
    """log pi(y_t | y_<t) = z_{t, y_t} - logsumexp_v z_{t, v}, z = logits / temperature.

    logits: (B, T, V) any float dtype; labels: (B, T) int64 token ids.
    chunk_size: rows (tokens) per block; None: `block_rows` (a memory budget).
    Returns (B, T) float32 (float64 for float64 logits), differentiable w.r.t. logits
    without keeping a (B, T, V) log-softmax copy for backward.
    """
    rows = chunk_size or block_rows(labels.numel(), logits.shape[-1], default_block_elements(logits.device))
    return _LogProbEntropy.apply(logits, labels, float(temperature), rows, False)[0]


def entropy_from_logits(logits: Tensor) -> Tensor:
    """H(pi_t) = logsumexp_v z_v - sum_v softmax(z)_v z_v, per token (plain autograd reference).

    logits: (B, T, V). Returns (B, T) in the logits' dtype and keeps the softmax for backward;
    the trainer uses `log_probs_and_entropy` / `entropy_from_logits_chunked` instead.
    """
    p = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (p * logits).sum(-1)


def entropy_from_logits_chunked(logits: Tensor, chunk_size: int | None = None, *, temperature: float = 1.0) -> Tensor:
    """Same value as `entropy_from_logits(logits / temperature)`, computed in float32 blocks.

    logits: (B, T, V). chunk_size: tokens per block; None: `block_rows`.
    Returns (B, T) float32 (float64 for float64 logits); backward recomputes the softmax per block.
    """
    labels = torch.zeros(logits.shape[:-1], dtype=torch.long, device=logits.device)
    rows = chunk_size or block_rows(labels.numel(), logits.shape[-1], default_block_elements(logits.device))
    return _LogProbEntropy.apply(logits, labels, float(temperature), rows, True)[1]


def sum_pi_squared_from_logits(
    logits: Tensor, *, temperature: float = 1.0, max_block_elements: int | None = None
) -> Tensor:
    """sum_v pi_v^2 = exp(logsumexp(2 z) - 2 logsumexp(z)) per token, z = logits / temperature (no grad).

    logits: (B, T, V) any float dtype, cast to float32 block by block (as `log_probs_and_entropy`).
    Returns (B, T) float32 (float64 for float64 logits). Input of the optimal token baseline
    (`advantages.OptimalTokenBaseline`): ||d log pi_y / dz||^2 = 1 - 2 pi_y + sum_v pi_v^2.
    """
    with torch.no_grad():
        z = logits.reshape(-1, logits.shape[-1])
        cdt = _compute_dtype(logits.dtype)
        budget = max_block_elements or default_block_elements(logits.device)
        rows = block_rows(z.shape[0], z.shape[-1], budget)
        out = torch.empty(z.shape[0], dtype=cdt, device=z.device)
        for start in range(0, z.shape[0], rows):
            zc = _scaled_block(z[start:start + rows], 1.0 / temperature, cdt)
            out[start:start + rows] = torch.exp(torch.logsumexp(2 * zc, dim=-1) - 2 * torch.logsumexp(zc, dim=-1))
        return out.reshape(logits.shape[:-1])


class _GatheredLogProbs(torch.autograd.Function):
    """lp_k = z_{i_k} - lse(z) for K ids per row, z = logits / tau, in blocks; backward recomputes p.

    d lp_k / dz_v = 1[v = i_k] - p_v, so dL/dz_v = (sum_k g_k 1[v = i_k] - p_v sum_k g_k) / tau.
    """

    @staticmethod
    def forward(ctx, logits: Tensor, ids: Tensor, temperature: float, rows: int):
        z = logits.reshape(-1, logits.shape[-1])
        idx = ids.reshape(z.shape[0], -1)
        cdt = _compute_dtype(logits.dtype)
        inv_t = 1.0 / temperature
        lse = torch.empty(z.shape[0], dtype=cdt, device=z.device)
        out = torch.empty(idx.shape, dtype=cdt, device=z.device)
        for start in range(0, z.shape[0], rows):
            sl = slice(start, start + rows)
            zc = _scaled_block(z[sl], inv_t, cdt)
            block_lse = torch.logsumexp(zc, dim=-1, out=lse[sl])
            torch.sub(zc.gather(-1, idx[sl]), block_lse[:, None], out=out[sl])
        ctx.save_for_backward(logits, ids, lse)
        ctx.inv_t, ctx.rows = inv_t, rows
        return out.reshape(ids.shape)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor):
        logits, ids, lse = ctx.saved_tensors
        z = logits.reshape(-1, logits.shape[-1])
        idx = ids.reshape(z.shape[0], -1)
        g = grad.reshape(idx.shape).to(lse.dtype)
        g_sum = g.sum(-1)
        out = torch.empty_like(z)
        for start in range(0, z.shape[0], ctx.rows):
            sl = slice(start, start + ctx.rows)
            zc = _scaled_block(z[sl], ctx.inv_t, lse.dtype)
            weight = torch.sub(zc, lse[sl, None]).exp_().mul_(-g_sum[sl, None])
            weight.scatter_add_(-1, idx[sl], g[sl])
            if ctx.inv_t != 1.0:
                weight.mul_(ctx.inv_t)
            out[sl] = weight
        return out.reshape(logits.shape), None, None, None


def log_probs_at(
    logits: Tensor, ids: Tensor, *, temperature: float = 1.0, max_block_elements: int | None = None,
) -> Tensor:
    """log pi(v) for K given tokens v per position, pi = softmax(logits / temperature), in one blocked pass.

    logits: (B, T, V) any float dtype; ids: (B, T, K) int64 (e.g. a teacher's top-k tokens). Returns (B, T, K)
    float32 (float64 for float64 logits), differentiable w.r.t. logits without a (B, T, V) float32 copy:
    as `log_probs_and_entropy`, only the per-row log-sum-exp is saved and backward recomputes the softmax.
    """
    budget = max_block_elements or default_block_elements(logits.device)
    rows = block_rows(ids.shape[:-1].numel(), logits.shape[-1], budget)
    return _GatheredLogProbs.apply(logits, ids, float(temperature), rows)


def top_k_log_probs(
    logits: Tensor, k: int, *, temperature: float = 1.0, max_block_elements: int | None = None,
) -> tuple[Tensor, Tensor]:
    """The k most probable tokens per position and their log-probs under softmax(logits / temperature), no grad.

    logits: (B, T, V). Returns (ids (B, T, k) int64, log-probs (B, T, k) float32), most probable first. The
    order of the logits is the order of the probabilities at any temperature > 0, so the ids do not depend on it.
    """
    with torch.no_grad():
        ids = logits.topk(k, dim=-1).indices
        return ids, log_probs_at(logits, ids, temperature=temperature, max_block_elements=max_block_elements)


class _LinearLogProbEntropy(torch.autograd.Function):
    """`_LogProbEntropy` of z = (hidden @ weight^T) / tau, the LM head applied here rather than by the model.

    Recomputing (`keep_logits=False`): the (N, V) logits and their gradient never exist whole:
    forward computes each block's logits, its statistics, and drops it; backward recomputes the
    block's logits, forms dL/dz for the block and accumulates dL/dhidden = dz W and
    dL/dW = dz^T hidden. Keeping (`keep_logits=True`): forward computes the logits in one product
    and keeps them; backward overwrites each block of them with its dL/dz, then forms both
    gradients in one product each: the logits' memory once (a model's own head keeps them and
    then allocates their gradient beside them) and no matmul more than the plain path. Matrix
    products run in `compute_dtype` (the autocast dtype of the forward), statistics in float32.
    """

    @staticmethod
    def forward(ctx, hidden, weight, labels, temperature: float, rows: int, with_entropy: bool, compute_dtype,
                keep_logits: bool):
        h = hidden.reshape(-1, hidden.shape[-1])
        y = labels.reshape(-1, 1)
        w = weight.to(compute_dtype)
        inv_t = 1.0 / temperature
        n = h.shape[0]
        lse = torch.empty(n, dtype=torch.float32, device=h.device)
        log_probs = torch.empty_like(lse)
        entropy = torch.empty_like(lse) if with_entropy else None
        keep = keep_logits and any(ctx.needs_input_grad[:2])  # no backward, nothing to keep
        z = torch.mm(h.to(compute_dtype), w.t()) if keep else None
        for start in range(0, n, rows):
            sl = slice(start, start + rows)
            if keep:  # never written to here: backward reads the logits
                zc = _scaled_block(z[sl], inv_t, torch.float32)
            else:
                zc = torch.mm(h[sl].to(compute_dtype), w.t()).float().mul_(inv_t)
            block_lse = torch.logsumexp(zc, dim=-1, out=lse[sl])
            torch.sub(zc.gather(-1, y[sl]).squeeze(-1), block_lse, out=log_probs[sl])
            if entropy is not None:
                p = torch.sub(zc, block_lse[:, None]).exp_()
                torch.sub(block_lse, p.mul_(zc).sum(-1), out=entropy[sl])
        ctx.save_for_backward(hidden, weight, labels, lse, entropy if entropy is not None else lse,
                              z if keep else lse)
        ctx.inv_t, ctx.rows, ctx.with_entropy, ctx.compute_dtype = inv_t, rows, with_entropy, compute_dtype
        ctx.keep = keep
        ctx.set_materialize_grads(False)
        shape = labels.shape
        return log_probs.reshape(shape), (entropy.reshape(shape) if entropy is not None else None)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_lp, grad_h):
        hidden, weight, labels, lse, entropy, z = ctx.saved_tensors
        cdt, inv_t, rows = ctx.compute_dtype, ctx.inv_t, ctx.rows
        h = hidden.reshape(-1, hidden.shape[-1])
        y = labels.reshape(-1, 1)
        w = weight.to(cdt)
        g_lp = grad_lp.reshape(-1).float() if grad_lp is not None else torch.zeros_like(lse)
        g_h = grad_h.reshape(-1).float() if grad_h is not None and ctx.with_entropy else None
        if ctx.keep:
            return _kept_logits_backward(ctx, hidden, weight, h, w, y, z, lse, entropy, g_lp, g_h)
        grad_hidden = torch.empty_like(h) if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) \
            if ctx.needs_input_grad[1] else None
        for start in range(0, h.shape[0], rows):
            sl = slice(start, start + rows)
            hc = h[sl].to(cdt)
            zc = torch.mm(hc, w.t()).float().mul_(inv_t)
            p = torch.sub(zc, lse[sl, None]).exp_()
            if g_h is None:
                dz = p.mul_(-g_lp[sl, None])
            else:
                centered = zc.sub_((lse[sl] - entropy[sl])[:, None])
                dz = p.mul_(centered.mul_(g_h[sl, None]).add_(g_lp[sl, None])).neg_()
            dz.scatter_add_(-1, y[sl], g_lp[sl, None])
            dz = dz.mul_(inv_t).to(cdt)
            if grad_hidden is not None:
                grad_hidden[sl] = torch.mm(dz, w)
            if grad_weight is not None:
                grad_weight.add_(torch.mm(dz.t(), hc))
        grad_hidden = grad_hidden.reshape(hidden.shape) if grad_hidden is not None else None
        grad_weight = grad_weight.to(weight.dtype) if grad_weight is not None else None
        return grad_hidden, grad_weight, None, None, None, None, None, None


def _kept_logits_backward(ctx, hidden, weight, h, w, y, z, lse, entropy, g_lp, g_h):
    """`_LinearLogProbEntropy.backward` from the kept logits z (N, V): each block of z becomes its dL/dz
    in place (the same float32 arithmetic as the recomputing path), then dz W and dz^T hidden."""
    inv_t, rows, cdt = ctx.inv_t, ctx.rows, ctx.compute_dtype
    for start in range(0, z.shape[0], rows):
        sl = slice(start, start + rows)
        block = z[sl]
        zc = _scaled_block(block, inv_t, torch.float32)  # `block` itself when nothing changes: fine to overwrite now
        centered = torch.sub(zc, (lse[sl] - entropy[sl])[:, None]) if g_h is not None else None
        p = zc.sub_(lse[sl, None]).exp_()
        if centered is None:
            dz = p.mul_(-g_lp[sl, None])
        else:
            dz = p.mul_(centered.mul_(g_h[sl, None]).add_(g_lp[sl, None])).neg_()
        dz.scatter_add_(-1, y[sl], g_lp[sl, None])
        if inv_t != 1.0:
            dz.mul_(inv_t)
        if dz.data_ptr() != block.data_ptr():
            block.copy_(dz)
    grad_hidden = torch.mm(z, w).reshape(hidden.shape).to(hidden.dtype) if ctx.needs_input_grad[0] else None
    grad_weight = torch.mm(z.t(), h.to(cdt)).to(weight.dtype) if ctx.needs_input_grad[1] else None
    return grad_hidden, grad_weight, None, None, None, None, None, None


def linear_log_probs_and_entropy(
    hidden: Tensor,
    weight: Tensor,
    labels: Tensor,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    max_block_elements: int | None = None,  # None: default_block_elements(hidden.device)
    keep_logits: bool = False,  # keep the logits for backward instead of recomputing them
) -> tuple[Tensor, Tensor | None]:
    """`log_probs_and_entropy(hidden @ weight^T, labels, ...)`, the LM head applied here.

    hidden: (B, T, H) final hidden states (the LM head's input); weight: (V, H) the LM head's
    weight (no bias); labels: (B, T). Matrix products run in the autocast dtype when autocast is
    on (else the hidden states' dtype), statistics in float32. Against the model's own head
    followed by `log_probs_and_entropy`, which keeps the (B, T, V) logits and then allocates their
    gradient: `keep_logits=False` keeps neither, at the cost of recomputing the head's product in
    backward (one extra (B*T, H) x (H, V) matmul: memory first, for GPUs); `keep_logits=True`
    keeps the logits once and turns them into their gradient in place, with no extra matmul
    (compute first, for CPUs). Without autograd both keep nothing.
    """
    device = hidden.device
    if torch.is_autocast_enabled(device.type):
        compute = torch.get_autocast_dtype(device.type)
    else:
        compute = torch.promote_types(hidden.dtype, weight.dtype)
    budget = max_block_elements or default_block_elements(device)
    rows = block_rows(labels.numel(), weight.shape[0], budget)
    return _LinearLogProbEntropy.apply(hidden, weight, labels, float(temperature), rows, with_entropy, compute,
                                       keep_logits)
