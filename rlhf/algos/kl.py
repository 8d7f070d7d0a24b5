"""KL divergence between the policy and a reference: estimators, loss, reward penalty, controllers.

Notation: B batch, T response tokens. `log_probs` = log pi(y_t) and `ref_log_probs` =
log pi_ref(y_t), both (B, T), for tokens y_t sampled from pi. With r = pi_ref / pi, each
per-token estimator below has E_{y ~ pi}[k] ~ KL(pi || pi_ref) (Schulman, "Approximating
KL divergence", http://joschu.net/blog/kl-approx.html):

    k1  = log pi - log pi_ref = -log r        unbiased, high variance, can be negative
    abs = |log pi - log pi_ref|               biased, >= 0
    k2  = (log pi - log pi_ref)^2 / 2         biased (small for small KL), >= 0
    k3  = r - 1 - log r                       unbiased, low variance, >= 0

An estimator is chosen by putting the function itself in the graph:
`kl_loss=fdl.Config(KLLoss, estimator=kl_k2)`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from rlhf.algos.aggregation import Aggregation, token_mean
from rlhf.algos.masked import masked_zero

KLEstimator = Callable[[Tensor, Tensor], Tensor]


def kl_k1(log_probs: Tensor, ref_log_probs: Tensor) -> Tensor:
    """k1 = log pi - log pi_ref, (B, T). Unbiased for KL(pi || pi_ref); its gradient is
    the score function, which makes it the standard choice for a reward penalty."""
    return log_probs - ref_log_probs


def kl_abs(log_probs: Tensor, ref_log_probs: Tensor) -> Tensor:
    """|log pi - log pi_ref|, (B, T). Biased, non-negative."""
    return (log_probs - ref_log_probs).abs()


def kl_k2(log_probs: Tensor, ref_log_probs: Tensor) -> Tensor:
    """k2 = (log pi - log pi_ref)^2 / 2, (B, T). Non-negative; its gradient is the
    unbiased gradient of KL(pi || pi_ref) under on-policy samples (GRPO's k3 gradient is not)."""
    d = log_probs - ref_log_probs
    return 0.5 * d * d


def kl_k3(
    log_probs: Tensor, ref_log_probs: Tensor, *, clamp: float = 10.0, log_ratio_clamp: float = 20.0
) -> Tensor:
    """k3 = r - 1 - log r with log r = log pi_ref - log pi, (B, T) (the GRPO paper's KL).

    Unbiased and low-variance for KL(pi || pi_ref); computed as expm1(log r) - log r so
    it is >= 0 in floating point too.
    clamp: the result is clamped to [0, clamp] (the gradient is 0 beyond it).
    log_ratio_clamp: log r is first clamped to +-log_ratio_clamp so exp never overflows.
    """
    log_r = (ref_log_probs - log_probs).clamp(-log_ratio_clamp, log_ratio_clamp)
    return (torch.expm1(log_r) - log_r).clamp(0.0, clamp)


class StraightThrough:
    """Value of one estimator, gradient of another: k = g + stopgrad(v - g).

    value: the estimator whose number is reported and added to the loss (default k3).
    grad: the estimator whose gradient flows (default k2, unbiased on-policy).
    Returns (B, T).
    """

    def __init__(self, value: KLEstimator = kl_k3, grad: KLEstimator = kl_k2):
        self.value = value
        self.grad = grad

    def __call__(self, log_probs: Tensor, ref_log_probs: Tensor) -> Tensor:
        g = self.grad(log_probs, ref_log_probs)
        v = self.value(log_probs, ref_log_probs)
        return g + (v - g).detach()

    def __repr__(self) -> str:
        return f"StraightThrough(value={_name(self.value)}, grad={_name(self.grad)})"


def _name(fn: Any) -> str:
    return getattr(fn, "__name__", repr(fn))


class KLLoss:
    """KL to the reference as a loss term: L_kl = coef * aggregate(k(log pi, log pi_ref), mask).

    estimator: per-token KL estimator (default k3, as in GRPO, arXiv:2402.03300).
    coef: weight beta of the term (GRPO uses 0.04; verl's default 0.001).
    aggregate: aggregation function (see `aggregation`).
    Called (log_probs (B,T), ref_log_probs (B,T), response_mask (B,T), *, num_tokens,
    num_seqs, max_new_tokens) -> (loss including coef, {"kl_loss": aggregated KL without coef, "kl_coef"}).
    """

    def __init__(self, estimator: KLEstimator = kl_k3, coef: float = 0.001, aggregate: Aggregation = token_mean):
        self.estimator = estimator
        self.coef = coef
        self.aggregate = aggregate

    def __call__(
        self,
        log_probs: Tensor,
        ref_log_probs: Tensor,
        response_mask: Tensor,
        *,
        num_tokens: float | None = None,
        num_seqs: float | None = None,
        max_new_tokens: int | None = None,
    ) -> tuple[Tensor, dict[str, Tensor]]:
        kl = self.estimator(log_probs, ref_log_probs)
        kl_agg = self.aggregate(kl, response_mask, num_tokens=num_tokens, num_seqs=num_seqs,
                                max_new_tokens=max_new_tokens)
        loss = self.coef * kl_agg
        metrics = {
            "kl_loss": kl_agg.detach(),
            "kl_coef": torch.tensor(float(self.coef), dtype=kl_agg.dtype, device=kl_agg.device),
        }
        return loss, metrics


def apply_kl_penalty(
    token_level_scores: Tensor,
    log_probs: Tensor,
    ref_log_probs: Tensor,
    response_mask: Tensor,
    coef: float,
    estimator: KLEstimator = kl_k1,
) -> tuple[Tensor, Tensor]:
    """KL as a reward penalty (Ziegler et al. 2019, arXiv:1909.08593; InstructGPT):

        r_t = s_t - coef * k(log pi(y_t), log pi_ref(y_t))     at valid tokens, 0 elsewhere.

    token_level_scores: (B, T) task reward per token (usually all on the last token).
    log_probs: (B, T) log-probs of the policy that sampled (old_log_probs).
    ref_log_probs: (B, T); response_mask: (B, T).
    coef: penalty weight beta (e.g. a KL controller's `.value`).
    estimator: per-token estimator (default k1, the unbiased one).
    Returns (token_level_rewards (B, T), kl_per_token (B, T)), both 0 at masked positions.
    Computed without gradient. The batch KL to feed a controller is
    `masked_mean(kl_per_token, response_mask, dim=-1).mean()`.
    """
    with torch.no_grad():
        kl = masked_zero(estimator(log_probs, ref_log_probs), response_mask)
        rewards = masked_zero(token_level_scores - coef * kl, response_mask)
    return rewards, kl


class FixedKLController:
    """A constant KL coefficient. coef: the value returned by `.value` forever."""

    def __init__(self, coef: float):
        self.value = float(coef)

    def update(self, current_kl: float | Tensor, n_steps: int) -> None:
        """No-op (kept so fixed and adaptive controllers are interchangeable)."""

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value = float(state["value"])


class AdaptiveKLController:
    """Adaptive KL coefficient (Ziegler et al. 2019, arXiv:1909.08593, section 2.2):

        e = clip(KL_current / KL_target - 1, -0.2, 0.2)
        beta <- beta * (1 + e * n_steps / horizon)

    init_coef: starting beta. target_kl: KL the controller steers to.
    horizon: number of samples over which the error is corrected (Ziegler: 10000).
    """

    def __init__(self, init_coef: float, target_kl: float, horizon: int):
        if target_kl <= 0 or horizon <= 0:
            raise ValueError(f"target_kl and horizon must be positive, got {target_kl}, {horizon}")
        self.value = float(init_coef)
        self.target_kl = float(target_kl)
        self.horizon = horizon

    def update(self, current_kl: float | Tensor, n_steps: int) -> None:
        """Move beta towards keeping KL at target; n_steps: samples seen since the last update."""
        error = min(max(float(current_kl) / self.target_kl - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value = float(state["value"])
