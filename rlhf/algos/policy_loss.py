"""Policy-gradient losses.

Notation: B batch, T response tokens. Every loss object is called

    loss_obj(log_probs, old_log_probs, advantages, response_mask, *,
             num_tokens=None, num_seqs=None, max_new_tokens=None, rollout_is_weights=None) -> (loss, metrics)

log_probs: (B, T) log pi_theta(y_t) of the policy being trained (carries the gradient).
old_log_probs: (B, T) log pi_old(y_t) of the policy that sampled (no gradient).
advantages: (B, T) A_t (no gradient).
response_mask: (B, T) nonzero = token is trained on; zero = padding / tool output / rejected.
num_tokens, num_seqs: global counts for the aggregation (see `aggregation`).
max_new_tokens: the generation limit, for `seq_mean_token_sum_norm` (see `aggregation`).
rollout_is_weights: optional (B, T) rollout-correction weights (see `rollout_correction`),
    multiplied into the per-token loss, never differentiated.

With r_t = pi_theta / pi_old = exp(log_probs - old_log_probs) (the log-ratio is clamped to
+-20 before exp so nothing overflows), the loss is `aggregate(l, response_mask, ...)` of a
per-token loss matrix l (B, T). Metrics (scalar tensors, detached, means over the valid
tokens of this call):

    pg_loss            the returned loss
    pg_clipfrac        fraction of tokens where the trust-region clip changed the term
    pg_clipfrac_lower  (PPO with dual clip) fraction of tokens where the -c*A bound is active
    ppo_kl             mean of log pi_old - log pi_theta: approx KL(pi_old || pi_theta) (k1)

A loss is chosen by putting its class in the graph:
`policy_loss=fdl.Config(PPOClipLoss, clip_high=0.28)`.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
from torch import Tensor

from rlhf.algos.aggregation import Aggregation, seq_mean_token_mean, token_mean
from rlhf.algos.frozen import Frozen
from rlhf.algos.masked import as_bool, count, masked_mean

LOG_RATIO_CLAMP = 20.0  # exp(20) ~ 5e8: bounds every importance ratio before it is exponentiated


def _log_ratio(log_probs: Tensor, old_log_probs: Tensor) -> Tensor:
    return (log_probs - old_log_probs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def _frac(flag: Tensor, mask: Tensor) -> Tensor:
    return masked_mean(flag.to(torch.float32), mask).detach()


def zero_advantage_rows(advantages: Tensor, response_mask: Tensor) -> Tensor:
    """(B,) bool: the rows whose advantage is 0 at every response token (a masked one does not count). Where the
    loss says so (`PolicyLoss.zero_advantage_rows_inert`), they add nothing to it or to its gradient."""
    return ~((advantages != 0) & as_bool(response_mask)).any(dim=-1)


class PolicyLoss(Frozen):
    """Base class: subclasses implement `token_loss` and set `self.aggregate` (attributes are set once: `Frozen`)."""

    aggregate: Aggregation
    # Each row's loss is its own advantages times terms of that row only, so a row whose advantages are all 0 adds
    # nothing to the loss or its gradient (the aggregation divides by global counts, not by the rows present):
    # the policy worker's update can leave such rows out (`PolicyObjective.skip_inert_rows`). False where a
    # batch statistic couples the rows (Clip-Cov, KL-Cov) or for a subclass that has not said.
    zero_advantage_rows_inert: ClassVar[bool] = False

    def token_loss(
        self, log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor, response_mask: Tensor
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """Per-token loss matrix l (B, T) and loss-specific metrics."""
        raise NotImplementedError

    def weigh(self, loss_mat: Tensor, rollout_is_weights: Tensor, response_mask: Tensor) -> Tensor:
        """Apply rollout-correction weights (B, T) to the loss matrix (token-wise by default)."""
        return loss_mat * rollout_is_weights.detach()

    def __call__(
        self,
        log_probs: Tensor,
        old_log_probs: Tensor,
        advantages: Tensor,
        response_mask: Tensor,
        *,
        num_tokens: float | None = None,
        num_seqs: float | None = None,
        max_new_tokens: int | None = None,
        rollout_is_weights: Tensor | None = None,
    ) -> tuple[Tensor, dict[str, Tensor]]:
        old_log_probs = old_log_probs.detach()
        advantages = advantages.detach()
        loss_mat, metrics = self.token_loss(log_probs, old_log_probs, advantages, response_mask)
        if rollout_is_weights is not None:
            loss_mat = self.weigh(loss_mat, rollout_is_weights, response_mask)
        loss = self.aggregate(loss_mat, response_mask, num_tokens=num_tokens, num_seqs=num_seqs,
                              max_new_tokens=max_new_tokens)
        ppo_kl = masked_mean(old_log_probs - log_probs.detach(), response_mask)
        return loss, {"pg_loss": loss.detach(), **metrics, "ppo_kl": ppo_kl}

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={getattr(v, '__name__', None) or repr(v)}" for k, v in vars(self).items())
        return f"{type(self).__name__}({args})"


class PPOClipLoss(PolicyLoss):
    """PPO clipped surrogate (Schulman et al. 2017, arXiv:1707.06347) with clip-higher
    (asymmetric range, DAPO arXiv:2503.14476) and optional dual clip (Ye et al. 2020,
    arXiv:1912.09729):

        l_t = max(-A_t r_t, -A_t clip(r_t, 1 - clip_low, 1 + clip_high))
        if dual_clip = c and A_t < 0:  l_t = min(l_t, -c A_t)

    At r = 1, l = -A. Where a clip is active the term is constant (zero gradient).
    clip_low: epsilon below 1. clip_high: epsilon above 1 (DAPO uses 0.28).
    dual_clip: c > 1 bounding the loss of negative-advantage tokens by -c*A; None disables.
    aggregate: aggregation function (see `aggregation`).
    Metrics: pg_loss, pg_clipfrac, pg_clipfrac_lower (0 without dual clip), ppo_kl.
    """

    zero_advantage_rows_inert = True

    def __init__(
        self,
        clip_low: float = 0.2,
        clip_high: float = 0.2,
        dual_clip: float | None = None,
        aggregate: Aggregation = token_mean,
    ):
        if dual_clip is not None and dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
        self.clip_low = clip_low
        self.clip_high = clip_high
        self.dual_clip = dual_clip
        self.aggregate = aggregate

    def token_loss(self, log_probs, old_log_probs, advantages, response_mask):
        ratio = torch.exp(_log_ratio(log_probs, old_log_probs))
        unclipped = -advantages * ratio
        clipped = -advantages * ratio.clamp(1.0 - self.clip_low, 1.0 + self.clip_high)
        is_clipped = clipped > unclipped  # only possible where the clamp moved the ratio
        loss = torch.where(is_clipped, clipped, unclipped)
        metrics = {"pg_clipfrac": _frac(is_clipped, response_mask)}
        if self.dual_clip is None:
            metrics["pg_clipfrac_lower"] = torch.zeros((), device=loss.device)
        else:
            bound = -advantages * self.dual_clip
            is_lower = (advantages < 0) & (loss > bound)
            loss = torch.where(is_lower, bound, loss)
            metrics["pg_clipfrac_lower"] = _frac(is_lower, response_mask)
        return loss, metrics


class GSPOLoss(PolicyLoss):
    """Group Sequence Policy Optimization (Zheng et al. 2025, arXiv:2507.18071), GSPO-token form:

        s_i    = exp( mean_{t in y_i} (log pi_theta - log pi_old) )       (sequence ratio)
        s_it   = sg[s_i] * pi_theta(y_t) / sg[pi_theta(y_t)]              (value s_i, grad of s_i per token)
        l_it   = max(-A_it s_it, -A_it clip(s_it, 1 - clip_low, 1 + clip_high))

    The whole sequence is clipped together, so ranges are tiny (paper: 3e-4 / 4e-4).
    aggregate: defaults to `seq_mean_token_mean`, the paper's (1/G) sum_i (1/|y_i|) sum_t;
        with it and a sequence-level A, the gradient is exactly that of -A_i clip(s_i).
    log s_it is clamped to <= 10 before exp (as verl). Metrics: pg_loss, pg_clipfrac, ppo_kl.
    """

    zero_advantage_rows_inert = True

    def __init__(self, clip_low: float = 3e-4, clip_high: float = 4e-4, aggregate: Aggregation = seq_mean_token_mean):
        self.clip_low = clip_low
        self.clip_high = clip_high
        self.aggregate = aggregate

    def token_loss(self, log_probs, old_log_probs, advantages, response_mask):
        seq_log_ratio = masked_mean(log_probs - old_log_probs, response_mask, dim=-1).detach()
        log_s = log_probs - log_probs.detach() + seq_log_ratio.unsqueeze(-1)
        s = torch.exp(log_s.clamp(-LOG_RATIO_CLAMP, 10.0))
        unclipped = -advantages * s
        clipped = -advantages * s.clamp(1.0 - self.clip_low, 1.0 + self.clip_high)
        is_clipped = clipped > unclipped
        loss = torch.where(is_clipped, clipped, unclipped)
        return loss, {"pg_clipfrac": _frac(is_clipped, response_mask)}


class SAPOLoss(PolicyLoss):
    """Soft Adaptive Policy Optimization (Gao et al. 2025, arXiv:2511.20347): a smooth gate
    replaces the hard clip.

        f_tau(r) = sigmoid(tau (r - 1)) * 4 / tau,   tau = tau_pos if A_t > 0 else tau_neg
        l_t      = -f_tau(r_t) A_t

    f'(1) = 1, so at r = 1 the gradient equals PPO's; the gate decays smoothly as r leaves 1
    (faster for negative advantages, tau_neg > tau_pos). At r = 1 the loss is -2 A / tau.
    tau_pos, tau_neg: gate temperatures (paper: 1.0 and 1.05).
    aggregate: defaults to `seq_mean_token_mean` (the paper's per-sequence mean).
    Metrics: pg_loss, ppo_kl.
    """

    zero_advantage_rows_inert = True

    def __init__(self, tau_pos: float = 1.0, tau_neg: float = 1.05, aggregate: Aggregation = seq_mean_token_mean):
        self.tau_pos = tau_pos
        self.tau_neg = tau_neg
        self.aggregate = aggregate

    def token_loss(self, log_probs, old_log_probs, advantages, response_mask):
        ratio = torch.exp(_log_ratio(log_probs, old_log_probs))
        tau = torch.where(advantages > 0, self.tau_pos, self.tau_neg).to(ratio.dtype)
        gate = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
        return -gate * advantages, {}


class REINFORCELoss(PolicyLoss):
    """Plain policy gradient (Williams 1992): l_t = -A_t log pi_theta(y_t).

    On-policy only (no ratio, no clip); value at any point is -A log p. Its gradient equals
    PPO's at r = 1. aggregate: aggregation function. Metrics: pg_loss, ppo_kl.
    """

    zero_advantage_rows_inert = True

    def __init__(self, aggregate: Aggregation = token_mean):
        self.aggregate = aggregate

    def token_loss(self, log_probs, old_log_probs, advantages, response_mask):
        return -advantages * log_probs, {}


class GPGLoss(REINFORCELoss):
    """Group Policy Gradient loss (Chu et al. 2025, arXiv:2504.02546): l_t = -A_t log pi_theta(y_t).

    GPG optimises the original objective (no surrogate, no clip, no KL); its distinctive
    part is the advantage (`advantages.GPG`). Same formula as `REINFORCELoss`.
    """


class CISPOLoss(PolicyLoss):
    """Clipped IS-weight Policy Optimization (MiniMax-M1, arXiv:2506.13585):

        l_t = -sg[clip(r_t, 1 - clip_low, 1 + clip_high)] A_t log pi_theta(y_t)

    The importance weight is clipped and detached, so every token keeps a gradient
    (PPO drops the gradient of clipped tokens). Gradient at r = 1 equals PPO's.
    clip_low: None = no lower bound (MiniMax-M1 only bounds the weight above).
    clip_high: epsilon above 1. aggregate: aggregation function.
    Metrics: pg_loss, pg_clipfrac (weight clipped, either side), ppo_kl.
    """

    zero_advantage_rows_inert = True

    def __init__(self, clip_low: float | None = None, clip_high: float = 0.2, aggregate: Aggregation = token_mean):
        self.clip_low = clip_low
        self.clip_high = clip_high
        self.aggregate = aggregate

    def token_loss(self, log_probs, old_log_probs, advantages, response_mask):
        ratio = torch.exp(_log_ratio(log_probs, old_log_probs)).detach()
        low = None if self.clip_low is None else 1.0 - self.clip_low
        weight = ratio.clamp(low, 1.0 + self.clip_high)
        loss = -weight * advantages * log_probs
        return loss, {"pg_clipfrac": _frac(weight != ratio, response_mask)}


class GMPOLoss(PolicyLoss):
    """Geometric-Mean Policy Optimization (Zhao et al. 2025, arXiv:2507.20673):

        lr_t   = log pi_theta - log pi_old, clipped at the token level in the pessimistic
                 direction: A > 0 -> min(lr, clip_high); A < 0 -> max(lr, -clip_low); A = 0 -> 0
        rho_i  = exp( mean_{t in y_i} lr_t )       (geometric mean of the token ratios)
        L_i    = -mean_t(A_it) * rho_i

    The sequence loss L_i is spread over the sequence's tokens, so the default aggregate
    `seq_mean_token_mean` gives (1/N_seq) sum_i L_i (the paper's objective).
    clip_low, clip_high: bounds in log space (paper: (e^-0.4, e^0.4)).
    rollout_is_weights are combined per sequence by their geometric mean.
    Metrics: pg_loss, pg_clipfrac (token log-ratio changed by the clip), ppo_kl.
    """

    zero_advantage_rows_inert = True

    def __init__(self, clip_low: float = 0.4, clip_high: float = 0.4, aggregate: Aggregation = seq_mean_token_mean):
        self.clip_low = clip_low
        self.clip_high = clip_high
        self.aggregate = aggregate

    def token_loss(self, log_probs, old_log_probs, advantages, response_mask):
        lr = log_probs - old_log_probs
        lr_clamped = lr.clamp(-self.clip_low, self.clip_high)
        sign = torch.sign(advantages)
        lr_min = sign * torch.minimum(sign * lr, sign * lr_clamped)
        seq_lr = masked_mean(lr_min, response_mask, dim=-1).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        seq_adv = masked_mean(advantages, response_mask, dim=-1)
        seq_loss = -seq_adv * torch.exp(seq_lr)
        loss = seq_loss.unsqueeze(-1).expand_as(log_probs)
        changed = (lr_min != lr) & (advantages != 0)
        return loss, {"pg_clipfrac": _frac(changed, response_mask)}

    def weigh(self, loss_mat, rollout_is_weights, response_mask):
        log_w = torch.log(rollout_is_weights.detach().clamp_min(math.exp(-LOG_RATIO_CLAMP)))
        seq_w = torch.exp(masked_mean(log_w, response_mask, dim=-1))
        return loss_mat * seq_w.unsqueeze(-1)


def _covariance(advantages: Tensor, log_probs: Tensor, response_mask: Tensor) -> Tensor:
    """Per-token centred product (A - mean A)(log p - mean log p) over the valid tokens."""
    lp = log_probs.detach()
    return (advantages - masked_mean(advantages, response_mask)) * (lp - masked_mean(lp, response_mask))


class ClipCovLoss(PolicyLoss):
    """Clip-Cov (Cui et al. 2025, "The Entropy Mechanism of RL for Reasoning LMs",
    arXiv:2505.22617): PPO clip, plus the gradient of a few high-covariance tokens detached.

        cov_t = (A_t - mean A)(log pi_t - mean log pi)        over the valid tokens of this call
        candidates: valid, not already clipped by PPO, clip_cov_lb < cov_t < clip_cov_ub
        pick max(1, floor(clip_cov_ratio * N_valid)) candidates uniformly at random
        l_t = PPO clip term, with picked tokens' terms detached (value kept, gradient 0)

    clip_low, clip_high: PPO clip range. clip_cov_ratio: fraction of tokens detached.
    clip_cov_lb, clip_cov_ub: covariance window of the candidates.
    generator: torch.Generator for the random pick (None: the global RNG).
    aggregate: aggregation function.
    Metrics: pg_loss, pg_clipfrac (PPO), pg_clipcov_frac (detached by covariance), ppo_kl.
    """

    def __init__(
        self,
        clip_low: float = 0.2,
        clip_high: float = 0.2,
        clip_cov_ratio: float = 2e-4,
        clip_cov_lb: float = 1.0,
        clip_cov_ub: float = 5.0,
        generator: torch.Generator | None = None,
        aggregate: Aggregation = token_mean,
    ):
        if clip_cov_ratio <= 0:
            raise ValueError(f"clip_cov_ratio must be positive, got {clip_cov_ratio}")
        self.clip_low = clip_low
        self.clip_high = clip_high
        self.clip_cov_ratio = clip_cov_ratio
        self.clip_cov_lb = clip_cov_lb
        self.clip_cov_ub = clip_cov_ub
        self.generator = generator
        self.aggregate = aggregate

    def token_loss(self, log_probs, old_log_probs, advantages, response_mask):
        valid = as_bool(response_mask)
        ratio = torch.exp(_log_ratio(log_probs, old_log_probs))
        unclipped = -advantages * ratio
        clipped = -advantages * ratio.clamp(1.0 - self.clip_low, 1.0 + self.clip_high)
        is_clipped = clipped > unclipped
        loss = torch.where(is_clipped, clipped, unclipped)

        cov = _covariance(advantages, log_probs, response_mask)
        candidate = valid & ~is_clipped & (cov > self.clip_cov_lb) & (cov < self.clip_cov_ub)
        n_pick = max(int(self.clip_cov_ratio * int(count(valid))), 1)
        # Random subset of the candidates: random keys, -inf for non-candidates, top-k.
        gen = self.generator
        keys = torch.rand(cov.shape, generator=gen, device=gen.device if gen is not None else cov.device)
        keys = torch.where(candidate, keys.to(cov.device), -1.0).flatten()
        k = min(n_pick, keys.numel())
        top = torch.topk(keys, k).indices if k > 0 else keys.new_zeros(0, dtype=torch.long)
        picked = torch.zeros_like(keys, dtype=torch.bool)
        picked[top] = True
        picked = (picked & (keys >= 0)).view_as(cov)

        loss = torch.where(picked, loss.detach(), loss)
        return loss, {"pg_clipfrac": _frac(is_clipped, response_mask), "pg_clipcov_frac": _frac(picked, response_mask)}


class KLCovLoss(PolicyLoss):
    """KL-Cov (Cui et al. 2025, arXiv:2505.22617): unclipped surrogate, plus a KL penalty on
    the tokens with the largest covariance.

        cov_t = (A_t - mean A)(log pi_t - mean log pi)        over the valid tokens of this call
        top   = the max(1, floor(kl_cov_ratio * N_valid)) valid tokens with the largest cov_t
        l_t   = -A_t r_t + 1[t in top] * ppo_kl_coef * |log pi_theta - log pi_old|

    kl_cov_ratio: fraction of tokens penalised. ppo_kl_coef: penalty weight.
    aggregate: aggregation function. Metrics: pg_loss, pg_klcov_frac, ppo_kl.
    """

    def __init__(self, kl_cov_ratio: float = 2e-4, ppo_kl_coef: float = 1.0, aggregate: Aggregation = token_mean):
        if kl_cov_ratio <= 0:
            raise ValueError(f"kl_cov_ratio must be positive, got {kl_cov_ratio}")
        self.kl_cov_ratio = kl_cov_ratio
        self.ppo_kl_coef = ppo_kl_coef
        self.aggregate = aggregate

    def token_loss(self, log_probs, old_log_probs, advantages, response_mask):
        valid = as_bool(response_mask)
        log_ratio = _log_ratio(log_probs, old_log_probs)
        loss = -advantages * torch.exp(log_ratio)
        n_valid = int(count(valid))
        picked = torch.zeros_like(valid)
        if n_valid > 0:
            k = max(int(self.kl_cov_ratio * n_valid), 1)
            cov = torch.where(valid, _covariance(advantages, log_probs, response_mask), float("-inf"))
            top = torch.topk(cov.flatten(), k).indices
            picked = picked.flatten().index_fill(0, top, True).view_as(valid)
        loss = loss + picked * (self.ppo_kl_coef * log_ratio.abs())
        return loss, {"pg_klcov_frac": _frac(picked, response_mask)}
