"""Rollout-mismatch correction: the rollout engine's log-probs differ from the trainer's.

The engine (vLLM, bf16 kernels, an older checkpoint) samples from pi_rollout; the trainer
evaluates pi_old. With rho_t = pi_old(y_t) / pi_rollout(y_t), the tools here are
(Liu, Li et al. 2025, "When Speed Kills Stability", https://richardli.xyz/rl-collapse; Yao
et al. 2025, "Your efficient RL framework secretly brings you off-policy RL training"):

- truncated importance sampling (TIS): multiply the policy loss by min(rho, threshold), at
  token level (`TokenTIS`) or sequence level (`SequenceTIS`, rho_i = prod_t rho_t);
- rejection: drop tokens or whole sequences whose mismatch statistic is out of bounds
  (`RejectionMask`: a KL estimator k1/k2/k3 per token, reduced per token or by the sum,
  mean or max over the sequence);
- bypass mode: skip the trainer's old-log-prob pass and use old_log_probs := rollout
  log-probs, so the PPO ratio pi_theta / pi_rollout does the correction (`RolloutCorrection`);
- diagnostics (`mismatch_metrics`): KL, chi-square, effective sample size, perplexity gap.

Notation: B batch, T response tokens. log_probs: (B, T) trainer log-probs (pi_old);
rollout_log_probs: (B, T) engine log-probs of the same tokens; response_mask: (B, T) 0/1,
nonzero = a generated token that is trained on. Statistics are over the tensors passed
in: call these on the whole batch (driver side) for batch-level normalisation.
Metric keys carry no prefix (verl logs them under `rollout_corr/`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from rlhf.algos.frozen import Frozen
from rlhf.algos.kl import KLEstimator, kl_k3
from rlhf.algos.masked import as_bool, masked_max, masked_mean, masked_sum, masked_zero

SAFETY_BOUND = 20.0  # log-ratios are clamped to +-20 before exp (exp(20) ~ 5e8)


def _f(x: Tensor) -> Tensor:
    return x.detach().to(torch.float32)


def _exp(x: Tensor) -> Tensor:
    return torch.exp(x.clamp(-SAFETY_BOUND, SAFETY_BOUND))


Metrics = dict[str, Tensor]


def _weight_metrics(prefix: str, w: Tensor, raw_log_w: Tensor, unit_mask: Tensor, threshold: float) -> Metrics:
    """Stats of weights w over the units selected by unit_mask (tokens or sequences)."""
    log_thr = math.log(threshold)
    return {
        f"{prefix}_mean": _f(masked_mean(w, unit_mask)),
        f"{prefix}_max": _f(torch.exp(masked_max(raw_log_w, unit_mask).clamp(max=SAFETY_BOUND))),
        f"{prefix}_min": _f(torch.exp(-masked_max(-raw_log_w, unit_mask).clamp(max=SAFETY_BOUND))),
        f"{prefix}_ratio_fraction_high": _f(masked_mean((raw_log_w > log_thr).float(), unit_mask)),
        f"{prefix}_ratio_fraction_low": _f(masked_mean((raw_log_w < -log_thr).float(), unit_mask)),
        f"{prefix}_eff_sample_size": _f(effective_sample_size(w, unit_mask)),
    }


def effective_sample_size(weights: Tensor, mask: Tensor) -> Tensor:
    """Normalised ESS = (sum w)^2 / (n sum w^2) = 1 / mean((w / mean w)^2) over the selected
    weights (Kong 1992), in (0, 1]; 1 means uniform weights. 0 when nothing is selected."""
    mean = masked_mean(weights, mask)
    second = masked_mean(weights * weights, mask)
    return torch.where(second > 0, mean * mean / second.clamp_min(1e-30), 0.0)


class TokenTIS:
    """Token-level truncated importance sampling (TIS):

        w_t = min(rho_t, threshold),   rho_t = exp(log_probs_t - rollout_log_probs_t)

    Biased (truncation) but low variance. threshold: truncation bound C (verl default 2.0).
    batch_normalize: divide by the mean weight over the valid tokens (mean becomes 1).
    Called (log_probs, rollout_log_probs, response_mask) -> (weights (B, T) detached, 0 at
    masked positions; metrics rollout_is_{mean,max,min,ratio_fraction_high,ratio_fraction_low,
    eff_sample_size}[, rollout_is_batch_norm_factor]) with max/min/fractions before truncation.
    """

    def __init__(self, threshold: float = 2.0, batch_normalize: bool = False):
        if threshold <= 0:
            raise ValueError(f"threshold must be positive, got {threshold}")
        self.threshold = threshold
        self.batch_normalize = batch_normalize

    def __call__(self, log_probs: Tensor, rollout_log_probs: Tensor, response_mask: Tensor) -> tuple[Tensor, Metrics]:
        with torch.no_grad():
            log_w = masked_zero(log_probs - rollout_log_probs, response_mask)
            w = torch.exp(log_w.clamp(-SAFETY_BOUND, math.log(self.threshold)))
            w = masked_zero(w, response_mask)
            metrics = _weight_metrics("rollout_is", w, log_w, response_mask, self.threshold)
            if self.batch_normalize:
                norm = masked_mean(w, response_mask)
                w = w / torch.where(norm > 0, norm, 1.0)
                metrics["rollout_is_batch_norm_factor"] = _f(norm)
        return w, metrics

    def __repr__(self) -> str:
        return f"TokenTIS(threshold={self.threshold}, batch_normalize={self.batch_normalize})"


class SequenceTIS:
    """Sequence-level truncated importance sampling:

        w_i = min(prod_t rho_t, threshold) = min(exp(sum_t m_t (log_probs - rollout_log_probs)), threshold)

    broadcast over the sequence's tokens. Unbiased before truncation, high variance for long
    sequences. threshold: truncation bound. batch_normalize: divide by the mean weight over
    the sequences with a valid token. Output as `TokenTIS`, statistics per sequence.
    """

    def __init__(self, threshold: float = 2.0, batch_normalize: bool = False):
        if threshold <= 0:
            raise ValueError(f"threshold must be positive, got {threshold}")
        self.threshold = threshold
        self.batch_normalize = batch_normalize

    def __call__(self, log_probs: Tensor, rollout_log_probs: Tensor, response_mask: Tensor) -> tuple[Tensor, Metrics]:
        with torch.no_grad():
            seq_valid = as_bool(response_mask).any(-1)
            log_w = masked_sum(log_probs - rollout_log_probs, response_mask, dim=-1)
            w_seq = torch.exp(log_w.clamp(-SAFETY_BOUND, math.log(self.threshold)))
            metrics = _weight_metrics("rollout_is", w_seq, log_w, seq_valid, self.threshold)
            if self.batch_normalize:
                norm = masked_mean(w_seq, seq_valid)
                w_seq = w_seq / torch.where(norm > 0, norm, 1.0)
                metrics["rollout_is_batch_norm_factor"] = _f(norm)
            w = masked_zero(w_seq.unsqueeze(-1).expand_as(log_probs), response_mask)
        return w, metrics

    def __repr__(self) -> str:
        return f"SequenceTIS(threshold={self.threshold}, batch_normalize={self.batch_normalize})"


Reduction = Callable[[Tensor, Tensor], Tensor]


def reduce_token(stat: Tensor, mask: Tensor) -> Tensor:
    """Per-token statistic (B, T): each token is accepted or rejected on its own."""
    return stat


def reduce_seq_sum(stat: Tensor, mask: Tensor) -> Tensor:
    """sum_t m_t stat_t -> (B, 1): grows with length (a product of ratios for k1)."""
    return masked_sum(stat, mask, dim=-1).unsqueeze(-1)


def reduce_seq_mean(stat: Tensor, mask: Tensor) -> Tensor:
    """mean_t stat_t over valid tokens -> (B, 1): length-normalised (geometric mean for k1)."""
    return masked_mean(stat, mask, dim=-1).unsqueeze(-1)


def reduce_seq_max(stat: Tensor, mask: Tensor) -> Tensor:
    """max_t stat_t over valid tokens -> (B, 1): rejects a sequence for its worst token."""
    return masked_max(stat, mask, dim=-1).unsqueeze(-1)


class RejectionMask:
    """Rejection of mismatched tokens / sequences (they leave the loss; no re-weighting).

        s_t  = estimator(rollout_log_probs, log_probs)_t    per-token KL(pi_rollout || pi_old)
               estimate on the engine's samples: k1 = -log rho, k2 = (log rho)^2 / 2,
               k3 = rho - 1 - log rho
        s    = reduce(s_t, mask)                             per token or per sequence
        keep = lower <= s <= upper                           (a bound of None is open)

    Examples (verl option names): token_k1 with rho in [0.5, 2]:
    `RejectionMask(estimator=kl_k1, reduce=reduce_token, lower=-log 2, upper=log 2)`;
    seq_max_k2 at 2.5: `RejectionMask(estimator=kl_k2, reduce=reduce_seq_max, upper=2.5)`;
    the token veto (drop a sequence with any rho_t < 1e-4):
    `RejectionMask(estimator=kl_k1, reduce=reduce_seq_max, upper=-log 1e-4)`.
    upper, lower: bounds on s. estimator: per-token statistic (a `kl` estimator).
    reduce: `reduce_token`, `reduce_seq_sum`, `reduce_seq_mean` or `reduce_seq_max`.
    name: metric-key prefix (change it when combining several masks).
    Called (log_probs, rollout_log_probs, response_mask) -> (response_mask with rejected
    tokens set to 0 (same dtype), metrics {name}_{masked_fraction, seq_masked_fraction,
    stat_mean, stat_max}).
    """

    def __init__(
        self,
        upper: float | None,
        estimator: KLEstimator = kl_k3,
        reduce: Reduction = reduce_seq_mean,
        lower: float | None = None,
        name: str = "rollout_rs",
    ):
        if upper is None and lower is None:
            raise ValueError("RejectionMask needs at least one bound")
        self.upper = upper
        self.lower = lower
        self.estimator = estimator
        self.reduce = reduce
        self.name = name

    def __call__(self, log_probs: Tensor, rollout_log_probs: Tensor, response_mask: Tensor) -> tuple[Tensor, Metrics]:
        with torch.no_grad():
            valid = as_bool(response_mask)
            stat = self.reduce(masked_zero(self.estimator(rollout_log_probs, log_probs), valid), valid)
            keep = torch.ones_like(stat, dtype=torch.bool)
            if self.upper is not None:
                keep &= stat <= self.upper
            if self.lower is not None:
                keep &= stat >= self.lower
            keep = keep.expand_as(valid)
            rejected = valid & ~keep
            new_mask = masked_zero(response_mask, keep)
            stat_full = stat.expand_as(valid)
            n = self.name
            metrics = {
                f"{n}_masked_fraction": _f(masked_mean(rejected.float(), valid)),
                f"{n}_seq_masked_fraction": _f(masked_mean(rejected.any(-1).float(), valid.any(-1))),
                f"{n}_stat_mean": _f(masked_mean(stat_full, valid)),
                f"{n}_stat_max": _f(masked_max(stat_full, valid)),
            }
        return new_mask, metrics

    def __repr__(self) -> str:
        name = lambda f: getattr(f, "__name__", repr(f))  # noqa: E731
        return (
            f"RejectionMask(upper={self.upper}, estimator={name(self.estimator)}, "
            f"reduce={name(self.reduce)}, lower={self.lower}, name={self.name!r})"
        )


def mismatch_metrics(log_probs: Tensor, rollout_log_probs: Tensor, response_mask: Tensor) -> dict[str, Tensor]:
    """Diagnostics of the trainer/engine mismatch, rho = pi_old / pi_rollout (no grad):

        kl             mean_t (log pi_rollout - log pi_old)           k1 of KL(rollout || old)
        k3_kl          mean_t (rho - 1 - log rho)                      k3 of the same
        chi2_token     mean_t rho^2 - 1                                chi^2(old || rollout), tokens
        chi2_seq       mean_i (prod_t rho_t)^2 - 1                     same, whole sequences
        ess_token      1 / mean_t (rho / mean rho)^2                   normalised ESS, in (0, 1]
        ess_seq        same over sequence weights prod_t rho_t
        training_ppl   mean_i exp(-mean_t log pi_old)                  per-sequence perplexity
        rollout_ppl    mean_i exp(-mean_t log pi_rollout)
        log_ppl_diff   mean_i (mean_t log pi_rollout - mean_t log pi_old) = log(ppl_old / ppl_rollout)
        log_ppl_abs_diff, ppl_ratio = mean_i exp(log_ppl_diff)

    Means over valid tokens / sequences with a valid token (0 when there are none); every
    exponent (log rho, log-perplexity) is clamped to +-20. Returns scalar float32 tensors.
    """
    with torch.no_grad():
        valid = as_bool(response_mask)
        seq_valid = valid.any(-1)
        log_rho = masked_zero(log_probs - rollout_log_probs, valid).clamp(-SAFETY_BOUND, SAFETY_BOUND)
        rho = torch.exp(log_rho)
        log_rho_seq = masked_sum(log_probs - rollout_log_probs, valid, dim=-1).clamp(-SAFETY_BOUND, SAFETY_BOUND)
        rho_seq = torch.exp(log_rho_seq)
        mean_lp = masked_mean(log_probs, valid, dim=-1)
        mean_rollout = masked_mean(rollout_log_probs, valid, dim=-1)
        log_ppl_diff = mean_rollout - mean_lp
        any_token, any_seq = valid.any(), seq_valid.any()
        return {
            "kl": _f(masked_mean(-log_rho, valid)),
            "k3_kl": _f(masked_mean(torch.expm1(log_rho) - log_rho, valid)),
            "chi2_token": _f(torch.where(any_token, masked_mean(rho * rho, valid) - 1.0, 0.0)),
            "chi2_seq": _f(torch.where(any_seq, masked_mean(rho_seq * rho_seq, seq_valid) - 1.0, 0.0)),
            "ess_token": _f(effective_sample_size(rho, valid)),
            "ess_seq": _f(effective_sample_size(rho_seq, seq_valid)),
            "training_ppl": _f(masked_mean(_exp(-mean_lp), seq_valid)),
            "rollout_ppl": _f(masked_mean(_exp(-mean_rollout), seq_valid)),
            "log_ppl_diff": _f(masked_mean(log_ppl_diff, seq_valid)),
            "log_ppl_abs_diff": _f(masked_mean(log_ppl_diff.abs(), seq_valid)),
            "ppl_ratio": _f(masked_mean(_exp(log_ppl_diff), seq_valid)),
        }


@dataclasses.dataclass
class RolloutCorrectionOutput:
    """old_log_probs (B, T) to use in the policy loss; response_mask (B, T) after rejection;
    rollout_is_weights (B, T) or None, for the policy loss's `rollout_is_weights`; metrics."""

    old_log_probs: Tensor
    response_mask: Tensor
    rollout_is_weights: Tensor | None
    metrics: dict[str, Tensor]


class RolloutCorrection:
    """The whole correction step, run once per batch before the policy update.

        1. rejections, in order (a token survives only if every mask keeps it);
        2. IS weights on the surviving tokens (decoupled mode);
        3. diagnostics (`mismatch_metrics`) on the original mask.

    is_weights: `TokenTIS`, `SequenceTIS` or None (no re-weighting).
    rejections: `RejectionMask`s to apply (metric names must differ: set `name`).
    bypass: old_log_probs := rollout_log_probs, so the trainer skips its old-log-prob
        forward pass and the PPO ratio pi_theta / pi_rollout corrects the mismatch itself
        (no IS weights allowed). Rejections then need the trainer's log-probs: pass them,
        or apply the masks in the actor step against the current log-probs.
    Called (old_log_probs or None, rollout_log_probs, response_mask) -> RolloutCorrectionOutput.
    """

    def __init__(
        self,
        is_weights: TokenTIS | SequenceTIS | None = None,
        rejections: Sequence[RejectionMask] = (),
        bypass: bool = False,
    ):
        if bypass and is_weights is not None:
            raise ValueError("bypass mode corrects through the PPO ratio; is_weights must be None")
        names = [r.name for r in rejections]
        if len(set(names)) != len(names):
            raise ValueError(f"rejection masks need distinct names for their metrics, got {names}")
        self.is_weights = is_weights
        self.rejections = tuple(rejections)
        self.bypass = bypass

    def __call__(
        self, old_log_probs: Tensor | None, rollout_log_probs: Tensor, response_mask: Tensor
    ) -> RolloutCorrectionOutput:
        metrics: dict[str, Tensor] = {}
        mask = response_mask
        if old_log_probs is None:
            if not self.bypass or self.rejections:
                raise ValueError("old_log_probs are required unless bypass=True with no rejections")
        else:
            for rejection in self.rejections:
                mask, m = rejection(old_log_probs, rollout_log_probs, mask)
                metrics.update(m)
            metrics.update(mismatch_metrics(old_log_probs, rollout_log_probs, response_mask))
        weights = None
        if self.is_weights is not None:
            weights, m = self.is_weights(old_log_probs, rollout_log_probs, mask)
            metrics.update(m)
        new_old = rollout_log_probs.detach() if self.bypass else old_log_probs
        return RolloutCorrectionOutput(new_old, mask, weights, metrics)

    def __repr__(self) -> str:
        return (
            f"RolloutCorrection(is_weights={self.is_weights!r}, rejections={self.rejections!r}, "
            f"bypass={self.bypass})"
        )



class DecoupledPPO(Frozen):
    """AReaL's decoupled PPO objective for stale samples: the behaviour weights of the policy loss (Fu et al.
    2025, "AReaL: A Large-Scale Asynchronous Reinforcement Learning System for Language Reasoning",
    arXiv:2505.24298, after Hilton et al. 2021, "Batch size-invariance for policy optimization",
    arXiv:2110.00641):

        l_t = w_t * max(-A_t r_t, -A_t clip(r_t, 1 - eps, 1 + eps)),
        r_t = pi_theta(y_t) / pi_prox(y_t),    w_t = pi_prox(y_t) / pi_behav(y_t)  if it is <= cap, else 0

    pi_behav: the policy that sampled (`rollout_log_probs`, possibly versions old); pi_prox: the trainer's
    policy before this update (`old_log_probs`; on-policy, one epoch and one mini-batch, the current
    log-probs detached, so no extra forward pass). The clip keeps the update near pi_prox, and w corrects
    for sampling from pi_behav. A token with w_t above `behaviour_weight_cap` (AReaL's
    `behav_imp_weight_cap`, 5 in its asynchronous recipes) gets weight 0 but still counts in the
    aggregation's token count, as in AReaL.

    Called (prox_log_probs (B,T), rollout_log_probs (B,T), response_mask (B,T)) -> (weights (B,T),
    detached, 0 on masked and capped tokens; metrics `behaviour_weight_mean` (w before the cap) and
    `behaviour_capped_fraction`, token means over the mask).
    """

    def __init__(self, behaviour_weight_cap: float = 5.0):
        if behaviour_weight_cap <= 1.0:
            raise ValueError(f"DecoupledPPO: behaviour_weight_cap must be > 1 (AReaL's condition), "
                             f"got {behaviour_weight_cap}")
        self.behaviour_weight_cap = behaviour_weight_cap

    def __call__(self, prox_log_probs: Tensor, rollout_log_probs: Tensor,
                 response_mask: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        with torch.no_grad():
            valid = as_bool(response_mask)
            w = torch.exp(masked_zero(prox_log_probs - rollout_log_probs, valid).clamp(-SAFETY_BOUND, SAFETY_BOUND))
            capped = w > self.behaviour_weight_cap
            weights = masked_zero(w, valid & ~capped)
            metrics = {"behaviour_weight_mean": _f(masked_mean(w, valid)),
                       "behaviour_capped_fraction": _f(masked_mean(capped.float(), valid))}
        return weights, metrics

    def __repr__(self) -> str:
        return f"DecoupledPPO(behaviour_weight_cap={self.behaviour_weight_cap})"
