"""Advantage estimators.

Notation: B batch (responses), T response tokens, G a group of responses to one prompt.
Every estimator is a small class with a class attribute `requires_critic` and

    estimator(inputs: AdvantageInputs) -> (advantages (B, T), returns (B, T))

Both outputs are exactly 0 at masked positions, computed without gradient. `returns` is
the critic's regression target for GAE, the discounted return for REINFORCE++/ReMax/OTB,
and (as in verl) equal to the advantages for the outcome-only group estimators.

response_mask (B, T): nonzero = a token the policy generated and is trained on; zero =
padding, or a token inside the response the policy did not generate (tool output). The
mask must be 0/1. Masked positions are transparent for the time recursions (GAE, returns):
they neither add their reward nor consume a discount step.

score_i = sum_t m_it r_it is the sequence reward for the outcome estimators. Group
estimators treat each group independently; a group of one sample has no baseline
information and gets advantage 0 (the optimal token baseline differs, see its docstring).
Group statistics are computed in float64.

An estimator is chosen by putting its class in the graph:
`advantage=fdl.Config(GRPO, norm_by_std=False)`.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import torch
from torch import Tensor

from rlhf.algos.frozen import Frozen
from rlhf.algos.groups import Groups, group_by
from rlhf.algos.masked import as_bool, count, masked_sum, masked_whiten
from rlhf.algos.scan import Packing, masked_reverse_discounted_cumsum, reverse_discounted_cumsum


@dataclasses.dataclass
class AdvantageInputs:
    """What the estimators read. All tensors share the batch dimension B.

    token_level_rewards: (B, T) reward per token (outcome rewards sit on the last valid token).
    response_mask: (B, T) 0/1, see module docstring.
    group_ids: (B,) int64, equal for samples of the same prompt (group estimators).
    values: (B, T) critic values V(s_t) (GAE).
    baseline_rewards: (B,) score of a baseline response, e.g. the greedy one (ReMax).
    old_log_probs: (B, T) log pi_old(y_t) of the sampled tokens (optimal token baseline).
    sum_pi_squared: (B, T) sum_v pi_old(v)^2 at each step (optimal token baseline; see
        `logprobs.sum_pi_squared_from_logits`).
    rollout_is_weights: (B, T) rollout-correction weights (optimal token baseline).
    teacher_log_probs: (B, T) log pi_teacher(y_t) of the sampled tokens at the sampling temperature
        (on-policy distillation, `rlhf.algos.distillation`).
    """

    token_level_rewards: Tensor
    response_mask: Tensor
    group_ids: Tensor | None = None
    values: Tensor | None = None
    baseline_rewards: Tensor | None = None
    old_log_probs: Tensor | None = None
    sum_pi_squared: Tensor | None = None
    rollout_is_weights: Tensor | None = None
    teacher_log_probs: Tensor | None = None


def _require(value: Tensor | None, name: str, estimator: str) -> Tensor:
    if value is None:
        raise ValueError(f"{estimator} needs AdvantageInputs.{name}")
    return value


def _scores(inputs: AdvantageInputs) -> Tensor:
    """(B,) float64 sequence scores sum_t m_t r_t (summed in the rewards' dtype)."""
    return masked_sum(inputs.token_level_rewards, inputs.response_mask, dim=-1).to(torch.float64)


def _broadcast(per_seq: Tensor, inputs: AdvantageInputs) -> Tensor:
    """(B,) -> (B, T) on the valid tokens, 0 elsewhere, in the rewards' float dtype."""
    dtype = torch.promote_types(inputs.token_level_rewards.dtype, torch.float32)
    m = inputs.response_mask.to(dtype)
    return per_seq.to(dtype).unsqueeze(-1) * m


def _groups(inputs: AdvantageInputs, estimator: str) -> Groups:
    return group_by(_require(inputs.group_ids, "group_ids", estimator))


class GAE(Frozen):
    """Generalized Advantage Estimation (Schulman et al. 2016, arXiv:1506.02438):

        delta_t = r_t + gamma V_{t+1} - V_t          (V after the last token = 0)
        A_t     = delta_t + gamma lam A_{t+1}
        R_t     = A_t + V_t                          (returns: the critic's target)

    over the valid tokens of each row; t+1 means the next valid token, so mask-0 positions
    inside a response (tool output) are skipped. lam = 1 gives the discounted return minus
    V; lam = 0 the one-step TD error.
    gamma: discount. lam: GAE lambda. whiten: whiten the advantages over the batch (verl
    always does; returns are taken before whitening).
    Vectorised over B; time is handled by two matmuls (see `scan`), not a loop over T.
    """

    requires_critic: ClassVar[bool] = True

    def __init__(self, gamma: float = 1.0, lam: float = 1.0, whiten: bool = False):
        self.gamma = gamma
        self.lam = lam
        self.whiten = whiten

    @torch.no_grad()
    def __call__(self, inputs: AdvantageInputs) -> tuple[Tensor, Tensor]:
        values = _require(inputs.values, "values", "GAE")
        dtype = torch.promote_types(values.dtype, torch.float32)
        packing = Packing(inputs.response_mask, dtype)
        values = values.to(dtype)
        v = packing.pack(values)
        delta = packing.pack(inputs.token_level_rewards.to(dtype))
        delta[:, :-1].add_(v[:, 1:], alpha=self.gamma)  # + gamma V_{t+1} (0 past the end)
        delta.sub_(v)
        adv = packing.unpack(reverse_discounted_cumsum(delta, self.gamma * self.lam))
        returns = torch.addcmul(adv, values, packing.weight)  # A + V on valid tokens, 0 elsewhere
        if self.whiten:
            adv = masked_whiten(adv, inputs.response_mask)
        return adv, returns

    def __repr__(self) -> str:
        return f"GAE(gamma={self.gamma}, lam={self.lam}, whiten={self.whiten})"


class GRPO(Frozen):
    """Group Relative Policy Optimization outcome advantage (Shao et al. 2024, arXiv:2402.03300):

        A_i = (score_i - mean_G(score)) / (std_G(score) + eps)      broadcast over y_i

    std is the unbiased (Bessel) standard deviation within the group.
    norm_by_std: divide by the group std; False is Dr.GRPO (Liu et al. 2025,
        arXiv:2503.20783), which removes the difficulty bias of the std normalisation.
    eps: added to the std (a group whose scores are all equal gets 0).
    Singleton groups get 0. returns = advantages.
    """

    requires_critic: ClassVar[bool] = False

    def __init__(self, norm_by_std: bool = True, eps: float = 1e-6):
        self.norm_by_std = norm_by_std
        self.eps = eps

    @torch.no_grad()
    def __call__(self, inputs: AdvantageInputs) -> tuple[Tensor, Tensor]:
        groups = _groups(inputs, "GRPO")
        scores = _scores(inputs)
        adv = scores - groups.broadcast(groups.mean(scores))
        if self.norm_by_std:
            adv = adv / (groups.broadcast(groups.std(scores)) + self.eps)
        adv = torch.where(groups.broadcast(groups.size) > 1, adv, 0.0)
        adv = _broadcast(adv, inputs)
        return adv, adv.clone()

    def __repr__(self) -> str:
        return f"GRPO(norm_by_std={self.norm_by_std}, eps={self.eps})"


class GRPOPassK(Frozen):
    """Pass@k advantage (Chen et al. 2025, arXiv:2503.19595, as in verl's grpo_passk): only
    the best sample of each group gets credit,

        A_best = (max_G score - second max_G score) [/ (std_G(score) + eps)],  others 0.

    Ties for the best go to the lowest batch index (their advantage is then 0 anyway).
    norm_by_std: divide by the group std. eps: added to the std.
    Singleton groups get 0. returns = advantages.
    """

    requires_critic: ClassVar[bool] = False

    def __init__(self, norm_by_std: bool = True, eps: float = 1e-6):
        self.norm_by_std = norm_by_std
        self.eps = eps

    @torch.no_grad()
    def __call__(self, inputs: AdvantageInputs) -> tuple[Tensor, Tensor]:
        groups = _groups(inputs, "GRPOPassK")
        scores = _scores(inputs)
        B = scores.shape[0]
        best = groups.broadcast(groups.amax(scores))
        index = torch.arange(B, device=scores.device)
        first_best = torch.where(scores == best, index, B).to(torch.float64)
        is_best = index == groups.broadcast(groups.amin(first_best)).to(torch.int64)
        second = groups.broadcast(groups.amax(torch.where(is_best, float("-inf"), scores)))
        adv = best - second
        if self.norm_by_std:
            adv = adv / (groups.broadcast(groups.std(scores)) + self.eps)
        adv = torch.where(is_best & (groups.broadcast(groups.size) > 1), adv, 0.0)
        adv = _broadcast(adv, inputs)
        return adv, adv.clone()

    def __repr__(self) -> str:
        return f"GRPOPassK(norm_by_std={self.norm_by_std}, eps={self.eps})"


class RLOO(Frozen):
    """REINFORCE Leave-One-Out (Ahmadian et al. 2024, arXiv:2402.14740; Kool et al. 2019):

        A_i = score_i - (sum_{j in G, j != i} score_j) / (n - 1) = n / (n - 1) (score_i - mean_G)

    Unbiased baseline (it excludes the sample itself). Singleton groups get 0.
    returns = advantages.
    """

    requires_critic: ClassVar[bool] = False

    @torch.no_grad()
    def __call__(self, inputs: AdvantageInputs) -> tuple[Tensor, Tensor]:
        groups = _groups(inputs, "RLOO")
        scores = _scores(inputs)
        n = groups.broadcast(groups.size).to(torch.float64)
        others = groups.broadcast(groups.sum(scores)) - scores
        adv = torch.where(n > 1, scores - others / (n - 1).clamp_min(1), 0.0)
        adv = _broadcast(adv, inputs)
        return adv, adv.clone()

    def __repr__(self) -> str:
        return "RLOO()"


class OPO(Frozen):
    """On-Policy RL with Optimal reward baseline (Hao et al. 2025, arXiv:2505.23585): a
    length-weighted group baseline, the variance-minimising one for sequence-level rewards,

        b_G = sum_{j in G} |y_j| score_j / sum_{j in G} |y_j|,     A_i = score_i - b_G

    |y_j| = number of valid tokens. The token-level sum of advantages in a group is 0.
    Singleton groups get 0. returns = advantages.
    """

    requires_critic: ClassVar[bool] = False

    @torch.no_grad()
    def __call__(self, inputs: AdvantageInputs) -> tuple[Tensor, Tensor]:
        groups = _groups(inputs, "OPO")
        scores = _scores(inputs)
        lengths = count(inputs.response_mask, dim=-1).to(torch.float64)
        baseline = groups.sum(lengths * scores) / groups.sum(lengths).clamp_min(1)
        adv = scores - groups.broadcast(baseline)
        adv = torch.where(groups.broadcast(groups.size) > 1, adv, 0.0)
        adv = _broadcast(adv, inputs)
        return adv, adv.clone()

    def __repr__(self) -> str:
        return "OPO()"


class GPG(Frozen):
    """Group Policy Gradient advantage (Chu et al. 2025, arXiv:2504.02546):

        A_i = alpha (score_i - mean_G(score)) / f_norm,     alpha = B / (B - M)

    M is the number of samples whose group has no reward spread (all equal, or a single
    sample): they carry no gradient, and alpha rescales the batch so the remaining ones make
    an unbiased batch-mean gradient ("accurate gradient estimation"). verl approximates
    B - M by the number of nonzero scores; this follows the paper.
    f_norm: constant normaliser (paper: 1, i.e. no std normalisation).
    rescale: apply alpha (False: alpha = 1).
    Singleton groups get 0. returns = advantages.
    """

    requires_critic: ClassVar[bool] = False

    def __init__(self, f_norm: float = 1.0, rescale: bool = True):
        self.f_norm = f_norm
        self.rescale = rescale

    @torch.no_grad()
    def __call__(self, inputs: AdvantageInputs) -> tuple[Tensor, Tensor]:
        groups = _groups(inputs, "GPG")
        scores = _scores(inputs)
        spread = groups.broadcast(groups.amax(scores) > groups.amin(scores))
        adv = torch.where(spread, scores - groups.broadcast(groups.mean(scores)), 0.0) / self.f_norm
        if self.rescale:
            informative = int(spread.sum())
            adv = adv * (scores.shape[0] / max(informative, 1))
        adv = _broadcast(adv, inputs)
        return adv, adv.clone()

    def __repr__(self) -> str:
        return f"GPG(f_norm={self.f_norm}, rescale={self.rescale})"


class ReinforcePlusPlus(Frozen):
    """REINFORCE++ (Hu 2025, arXiv:2501.03262): discounted reward-to-go, whitened over the batch.

        R_t = sum_{k >= t} gamma^{k - t} r_k   (valid tokens only; mask-0 positions skipped)
        A_t = whiten_batch(R)_t

    Token-level rewards (e.g. a per-token KL penalty from `apply_kl_penalty`) are credited
    to the tokens before them. gamma: discount. returns = R (unwhitened).
    """

    requires_critic: ClassVar[bool] = False

    def __init__(self, gamma: float = 1.0):
        self.gamma = gamma

    @torch.no_grad()
    def __call__(self, inputs: AdvantageInputs) -> tuple[Tensor, Tensor]:
        returns = masked_reverse_discounted_cumsum(inputs.token_level_rewards, inputs.response_mask, self.gamma)
        return masked_whiten(returns, inputs.response_mask), returns

    def __repr__(self) -> str:
        return f"ReinforcePlusPlus(gamma={self.gamma})"


class ReinforcePlusPlusBaseline(Frozen):
    """REINFORCE++ with a group baseline (Hu 2025, arXiv:2501.03262, "REINFORCE++-baseline"):

        A_i = whiten_batch( score_i - mean_G(score) )      broadcast over y_i

    The group mean removes the prompt's difficulty; the batch whitening (over all valid
    tokens) sets the scale. Singleton groups get 0 before whitening.
    returns = advantages.
    """

    requires_critic: ClassVar[bool] = False

    @torch.no_grad()
    def __call__(self, inputs: AdvantageInputs) -> tuple[Tensor, Tensor]:
        groups = _groups(inputs, "ReinforcePlusPlusBaseline")
        scores = _scores(inputs)
        centred = scores - groups.broadcast(groups.mean(scores))
        centred = torch.where(groups.broadcast(groups.size) > 1, centred, 0.0)
        adv = masked_whiten(_broadcast(centred, inputs), inputs.response_mask)
        return adv, adv.clone()

    def __repr__(self) -> str:
        return "ReinforcePlusPlusBaseline()"


class ReMax(Frozen):
    """ReMax (Li et al. 2023, arXiv:2310.10505): the reward of the greedy response as baseline.

        R_t = sum_{k >= t} r_k (valid tokens),    A_t = R_t - b_i

    baseline_rewards b (B,): score of the greedy (argmax) response to the same prompt.
    returns = R.
    """

    requires_critic: ClassVar[bool] = False

    @torch.no_grad()
    def __call__(self, inputs: AdvantageInputs) -> tuple[Tensor, Tensor]:
        baseline = _require(inputs.baseline_rewards, "baseline_rewards", "ReMax")
        returns = masked_reverse_discounted_cumsum(inputs.token_level_rewards, inputs.response_mask, 1.0)
        adv = returns - _broadcast(baseline, inputs)
        return adv, returns

    def __repr__(self) -> str:
        return "ReMax()"


class OptimalTokenBaseline(Frozen):
    """Optimal token baseline, OTB (Li et al., arXiv:2602.07078; verl `optimal_token_baseline`):
    a per-token, per-group baseline weighted by the gradient energy accumulated so far.

        G_t  = sum_{k >= t} r_k                                   reward-to-go (valid tokens)
        w_t  = (1 - 2 pi_t + sum_v pi_v^2) * rho_t^2               ||grad_z log pi(y_t)||^2, the
               logit-gradient proxy; rho = rollout_is_weights (1 when absent)
        W_t  = sum_{j <= t} m_j w_j                               realised energy up to t
        B_t  = sum_{i in G} m_it G_it W_it / (sum_{i in G} m_it W_it + eps)   per position t
        A_t  = G_t - B_t

    Positions are aligned by index t within the group (as verl). zero_tail: where exactly
    one sample of the group is still valid at t (e.g. the tail of the longest response),
    its own return would be its baseline, so B_t := 0 there instead (verl's
    handle_zero_tail; with it a singleton group gets A = G). eps: keeps B finite.
    Needs group_ids, old_log_probs (pi_t = exp) and sum_pi_squared. returns = G.
    """

    requires_critic: ClassVar[bool] = False

    def __init__(self, zero_tail: bool = True, eps: float = 1e-8):
        self.zero_tail = zero_tail
        self.eps = eps

    @torch.no_grad()
    def __call__(self, inputs: AdvantageInputs) -> tuple[Tensor, Tensor]:
        name = "OptimalTokenBaseline"
        groups = _groups(inputs, name)
        log_pi = _require(inputs.old_log_probs, "old_log_probs", name).to(torch.float64)
        sum_pi2 = _require(inputs.sum_pi_squared, "sum_pi_squared", name).to(torch.float64)
        m = as_bool(inputs.response_mask).to(torch.float64)
        dtype = torch.promote_types(inputs.token_level_rewards.dtype, torch.float32)
        G = masked_reverse_discounted_cumsum(inputs.token_level_rewards.to(torch.float64), m, 1.0)
        w = 1.0 - 2.0 * torch.exp(log_pi) + sum_pi2
        if inputs.rollout_is_weights is not None:
            w = w * inputs.rollout_is_weights.to(torch.float64).square()
        W = (w * m).cumsum(-1) * m
        baseline = groups.sum(G * W) / (groups.sum(W) + self.eps)  # (G, T)
        if self.zero_tail:
            baseline = torch.where(groups.sum(m) == 1, 0.0, baseline)
        adv = (G - groups.broadcast(baseline)) * m
        return adv.to(dtype), G.to(dtype)

    def __repr__(self) -> str:
        return f"OptimalTokenBaseline(zero_tail={self.zero_tail}, eps={self.eps})"
