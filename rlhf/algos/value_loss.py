"""Critic (value-function) loss.

Notation: B batch, T response tokens; response_mask (B, T) nonzero = the token is trained on.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlhf.algos.aggregation import Aggregation, token_mean
from rlhf.algos.masked import masked_mean


class ClippedValueLoss:
    """PPO's clipped value loss (OpenAI baselines; Schulman et al. 2017, arXiv:1707.06347):

        v_clip = V_old + clip(V - V_old, -clip_range, clip_range)
        l_t    = 0.5 * max((V - R)^2, (v_clip - R)^2)

    clip_range: how far the new value may move from the old one before its gradient stops;
        None disables clipping (plain 0.5 (V - R)^2).
    aggregate: aggregation function (see `aggregation`).
    Called (values (B,T) with grad, old_values (B,T), returns (B,T), response_mask (B,T), *,
    num_tokens, num_seqs) -> (loss, {"vf_loss", "vf_clipfrac"}); vf_clipfrac is the fraction
    of valid tokens where the clipped term is the larger one.
    """

    def __init__(self, clip_range: float | None = 0.2, aggregate: Aggregation = token_mean):
        self.clip_range = clip_range
        self.aggregate = aggregate

    def __call__(
        self,
        values: Tensor,
        old_values: Tensor,
        returns: Tensor,
        response_mask: Tensor,
        *,
        num_tokens: float | None = None,
        num_seqs: float | None = None,
        max_new_tokens: int | None = None,
    ) -> tuple[Tensor, dict[str, Tensor]]:
        old_values = old_values.detach()
        returns = returns.detach()
        unclipped = (values - returns).square()
        if self.clip_range is None:
            loss_mat = unclipped
            is_clipped = torch.zeros_like(unclipped, dtype=torch.bool)
        else:
            delta = values - old_values
            # exactly `values` inside the range, so rounding never flags an inactive clip
            v_clip = torch.where(
                delta.abs() > self.clip_range, old_values + delta.clamp(-self.clip_range, self.clip_range), values
            )
            clipped = (v_clip - returns).square()
            is_clipped = clipped > unclipped
            loss_mat = torch.where(is_clipped, clipped, unclipped)
        loss = 0.5 * self.aggregate(loss_mat, response_mask, num_tokens=num_tokens, num_seqs=num_seqs,
                                    max_new_tokens=max_new_tokens)
        clipfrac = masked_mean(is_clipped.to(torch.float32), response_mask)
        return loss, {"vf_loss": loss.detach(), "vf_clipfrac": clipfrac.detach()}

    def __repr__(self) -> str:
        agg = getattr(self.aggregate, "__name__", None) or repr(self.aggregate)
        return f"ClippedValueLoss(clip_range={self.clip_range}, aggregate={agg})"
