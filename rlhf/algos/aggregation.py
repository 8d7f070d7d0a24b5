"""Loss aggregation: a (B, T) per-token loss matrix -> one scalar.

Every aggregation has the signature

    fn(loss_mat (B, T), mask (B, T), *, num_tokens=None, num_seqs=None, max_new_tokens=None) -> scalar Tensor

mask: nonzero = the token counts in the loss; zero = padding or a token excluded from
training (tool output, rejected sample). `num_tokens` / `num_seqs` are the GLOBAL counts
over the whole optimisation batch (all data-parallel ranks and all micro-batches):

    num_tokens = #{valid tokens}                      (see `count_tokens`)
    num_seqs   = #{sequences with >= 1 valid token}   (see `count_seqs`)

When they are None the local counts of `mask` are used, i.e. the part is treated as the
whole batch. `max_new_tokens` is the generation limit (`SamplingParams.max_new_tokens`, which
the policy worker reads from the batch's meta); only `seq_mean_token_sum_norm` uses it. With the global counts, every aggregation is a sum of per-row terms divided
by a batch constant, so

    sum over parts of fn(part, num_tokens=N, num_seqs=S) == fn(full batch)

in value and in gradient. The value is this part's contribution to the batch loss: a
worker that accumulates gradients over micro-batches just sums; under DDP/FSDP, whose
all-reduce averages gradients over ranks, multiply by the world size. An all-zero global
count gives 0 (never NaN).

Choosing one: put the function itself in the graph, e.g.
`policy_loss=fdl.Config(PPOClipLoss, aggregate=seq_mean_token_mean)`.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor

from rlhf.algos.masked import as_bool, count, masked_sum


class Aggregation(Protocol):
    """fn(loss_mat (B, T), mask (B, T), *, num_tokens, num_seqs, max_new_tokens) -> scalar Tensor."""

    def __call__(
        self,
        loss_mat: Tensor,
        mask: Tensor,
        *,
        num_tokens: float | None = None,
        num_seqs: float | None = None,
        max_new_tokens: int | None = None,
    ) -> Tensor: ...


def count_tokens(mask: Tensor) -> Tensor:
    """Number of valid tokens in mask (B, T): the `num_tokens` every aggregation expects."""
    return count(mask)


def count_seqs(mask: Tensor) -> Tensor:
    """Number of rows of mask (B, T) with at least one valid token: the `num_seqs` count."""
    return count(as_bool(mask).any(dim=-1))


def _denominator(count: float | Tensor | None, local: Tensor, like: Tensor) -> Tensor:
    c = local if count is None else count
    return torch.as_tensor(c, dtype=like.dtype, device=like.device).clamp_min(1)


def token_mean(
    loss_mat: Tensor,
    mask: Tensor,
    *,
    num_tokens: float | None = None,
    num_seqs: float | None = None,
    max_new_tokens: int | None = None,
) -> Tensor:
    """L = (1 / N_tok) sum_{i,t} m_it l_it: every token weighs the same (DAPO, arXiv:2503.14476).

    Long responses contribute proportionally more tokens; the usual default.
    """
    total = masked_sum(loss_mat, mask)
    return total / _denominator(num_tokens, count_tokens(mask), total)


def seq_mean_token_sum(
    loss_mat: Tensor,
    mask: Tensor,
    *,
    num_tokens: float | None = None,
    num_seqs: float | None = None,
    max_new_tokens: int | None = None,
) -> Tensor:
    """L = (1 / N_seq) sum_i sum_t m_it l_it: per-sequence sums, averaged over sequences.

    The REINFORCE objective on whole sequences; the loss scale grows with length.
    """
    total = masked_sum(loss_mat, mask)
    return total / _denominator(num_seqs, count_seqs(mask), total)


def seq_mean_token_mean(
    loss_mat: Tensor,
    mask: Tensor,
    *,
    num_tokens: float | None = None,
    num_seqs: float | None = None,
    max_new_tokens: int | None = None,
) -> Tensor:
    """L = (1 / N_seq) sum_i [ sum_t m_it l_it / sum_t m_it ]: the original GRPO objective
    (Shao et al. 2024, arXiv:2402.03300); each sequence weighs the same whatever its length.

    Rows with no valid token contribute 0.
    """
    row_sum = masked_sum(loss_mat, mask, dim=-1)
    row_len = count(mask, dim=-1).to(row_sum.dtype).clamp_min(1)
    total = (row_sum / row_len).sum()
    return total / _denominator(num_seqs, count_seqs(mask), total)


def seq_mean_token_sum_norm(
    loss_mat: Tensor,
    mask: Tensor,
    *,
    num_tokens: float | None = None,
    num_seqs: float | None = None,
    max_new_tokens: int | None = None,
) -> Tensor:
    """L = (1 / (N_seq * L_max)) sum_i sum_t m_it l_it: Dr.GRPO's constant normaliser
    (Liu et al. 2025, "Understanding R1-Zero-Like Training", arXiv:2503.20783).

    Removes GRPO's length bias: the per-token weight does not depend on the response length.
    max_new_tokens: L_max, the generation limit. The policy worker passes the batch's own
        (`SamplingParams.max_new_tokens`, recorded by the rollout engine), so it is set once, in
        the sampling. None uses T = loss_mat.shape[-1] (verl's default; verl pads responses to
        its limit, so T is L_max there), which is only shard-invariant when every part has one T.
    """
    if max_new_tokens is not None and max_new_tokens <= 0:
        raise ValueError(f"seq_mean_token_sum_norm: max_new_tokens must be positive, got {max_new_tokens}")
    total = masked_sum(loss_mat, mask)
    norm = loss_mat.shape[-1] if max_new_tokens is None else max_new_tokens
    return total / _denominator(num_seqs, count_seqs(mask), total) / norm
