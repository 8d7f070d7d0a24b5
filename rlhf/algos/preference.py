"""The DPO family: losses that learn from preference pairs directly, without a reward model.

Notation: P pairs; per pair, log pi(y|x) summed over the completion's tokens for the policy (`chosen`,
`rejected`) and the frozen reference (`ref_chosen`, `ref_rejected`), the completions' token counts
|y_c|, |y_r|, and an optional margin m (reward units, 0 without one).

    h = (log pi(y_c) - log pi_ref(y_c)) - (log pi(y_r) - log pi_ref(y_r))     the log-ratio difference
    r_c = beta (log pi(y_c) - log pi_ref(y_c)),  r_r likewise                 DPO's implicit rewards

Every loss returns per-pair values; the batch loss is their sum over `num_pairs`, the pairs of the whole
batch (all ranks and micro-batches), so micro-batch losses add up to the batch mean (rlhf.algos.aggregation).
A margin m asks the pair's reward gap beta*h to exceed m (ODPO, Amini et al. 2024, arXiv:2402.10571; the
same m as the reward model's Bradley-Terry margin); `use_margin=False` ignores the data's margins.
Metrics use TRL's names: `rewards/chosen`, `rewards/rejected`, `rewards/margins` (r_c - r_r),
`rewards/accuracies` (share with r_c > r_r), `logps/chosen`, `logps/rejected` (summed log-probs).

Which to use (docs/preferences.md): `DPOLoss` first; `RobustDPOLoss` for noisy labels (an annotator who
flips a known share of pairs); `IPOLoss` when DPO overfits deterministic preferences (h grows without
bound: IPO pins it at 1/(2 beta)); `SimPOLoss` to drop the reference model (half the forwards, no
reference memory); `RPOLoss` when both rewards fall (the chosen answers' likelihood drops along with the
rejected ones'), as it adds the chosen answers' NLL.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from rlhf.algos.frozen import Frozen
from rlhf.algos.pairs import split_pairs


@dataclasses.dataclass(frozen=True)
class PairLogProbs:
    """What a preference loss reads, per pair (P,)."""

    chosen: Tensor  # log pi(y_c | x) of the policy, summed over the completion's tokens
    rejected: Tensor
    chosen_tokens: Tensor  # |y_c|: the completion's trained tokens (response_mask sum)
    rejected_tokens: Tensor
    ref_chosen: Tensor | None = None  # the same under the reference; None for reference-free losses
    ref_rejected: Tensor | None = None
    margin: Tensor | None = None  # per-pair margin in reward units; None: 0

    @classmethod
    def from_rows(
        cls, logps: Tensor, tokens: Tensor, ref_logps: Tensor | None = None, margin: Tensor | None = None
    ) -> PairLogProbs:
        """From per-row (2P,) values laid out chosen, rejected, chosen, ... (`margin` repeated on both rows)."""
        chosen, rejected = split_pairs(logps)
        chosen_tokens, rejected_tokens = split_pairs(tokens)
        ref = split_pairs(ref_logps) if ref_logps is not None else (None, None)
        return cls(chosen, rejected, chosen_tokens, rejected_tokens, *ref,
                   margin=split_pairs(margin)[0] if margin is not None else None)

    def log_ratio_difference(self) -> Tensor:
        """h = (log pi - log pi_ref)(y_c) - (log pi - log pi_ref)(y_r), (P,)."""
        if self.ref_chosen is None or self.ref_rejected is None:
            raise ValueError("this preference loss needs the reference model's log-probs (ref_chosen, ref_rejected)")
        return (self.chosen - self.ref_chosen) - (self.rejected - self.ref_rejected)


class PairLoss(NamedTuple):
    """A preference loss's per-pair outputs (P,): the loss and the implicit rewards its metrics report."""

    losses: Tensor
    chosen_rewards: Tensor
    rejected_rewards: Tensor


class PreferenceLoss(Frozen):
    """A loss over preference pairs: called with `PairLogProbs`, returns `PairLoss` (per pair)."""

    requires_reference: bool = True  # whether it reads ref_chosen / ref_rejected
    beta: float
    use_margin: bool

    def __call__(self, pairs: PairLogProbs) -> PairLoss:
        raise NotImplementedError

    def _margin(self, pairs: PairLogProbs) -> Tensor | float:
        return pairs.margin if self.use_margin and pairs.margin is not None else 0.0

    def _dpo_rewards(self, pairs: PairLogProbs) -> tuple[Tensor, Tensor]:
        return (self.beta * (pairs.chosen - pairs.ref_chosen).detach(),
                self.beta * (pairs.rejected - pairs.ref_rejected).detach())

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({fields})"


class DPOLoss(PreferenceLoss):
    """DPO (Rafailov et al. 2023, arXiv:2305.18290), TRL's `loss_type="sigmoid"`:

        z = beta * h - m
        l = -(1 - eps) log sigmoid(z) - eps log sigmoid(-z)

    eps = `label_smoothing` = 0 is DPO; eps > 0 is conservative DPO (cDPO, Mitchell 2023: the label is
    right with probability 1 - eps), whose minimum is at a finite z = log((1 - eps) / eps) instead of
    z -> infinity. beta: strength of the pull to the reference (0.1 is TRL's default; smaller lets the
    policy move further).
    """

    def __init__(self, beta: float = 0.1, label_smoothing: float = 0.0, use_margin: bool = True):
        if beta <= 0:
            raise ValueError(f"beta must be > 0, got {beta}")
        if not 0 <= label_smoothing <= 0.5:
            raise ValueError(f"label_smoothing must be in [0, 0.5], got {label_smoothing}")
        self.beta = beta
        self.label_smoothing = label_smoothing
        self.use_margin = use_margin

    def __call__(self, pairs: PairLogProbs) -> PairLoss:
        z = self.beta * pairs.log_ratio_difference() - self._margin(pairs)
        eps = self.label_smoothing
        losses = -(1 - eps) * F.logsigmoid(z) - (eps * F.logsigmoid(-z) if eps else 0.0)
        return PairLoss(losses, *self._dpo_rewards(pairs))


class RobustDPOLoss(PreferenceLoss):
    """Robust DPO (Chowdhury et al. 2024, "Provably Robust DPO", arXiv:2403.00409), TRL's `loss_type="robust"`:

        z = beta * h - m
        l = ((1 - eps) * -log sigmoid(z) - eps * -log sigmoid(-z)) / (1 - 2 eps)

    An unbiased estimate of the clean DPO loss when each label was flipped with probability eps =
    `label_smoothing`: (1 - eps) l(z) + eps l(-z) = -log sigmoid(z). Unlike cDPO it keeps pushing z up.
    """

    def __init__(self, beta: float = 0.1, label_smoothing: float = 0.1, use_margin: bool = True):
        if beta <= 0:
            raise ValueError(f"beta must be > 0, got {beta}")
        if not 0 <= label_smoothing < 0.5:
            raise ValueError(f"label_smoothing (the share of flipped labels) must be in [0, 0.5), got {label_smoothing}")
        self.beta = beta
        self.label_smoothing = label_smoothing
        self.use_margin = use_margin

    def __call__(self, pairs: PairLogProbs) -> PairLoss:
        z = self.beta * pairs.log_ratio_difference() - self._margin(pairs)
        eps = self.label_smoothing
        losses = (-(1 - eps) * F.logsigmoid(z) + eps * F.logsigmoid(-z)) / (1 - 2 * eps)
        return PairLoss(losses, *self._dpo_rewards(pairs))


class IPOLoss(PreferenceLoss):
    """IPO (Azar et al. 2023, "A General Theoretical Paradigm to Understand Learning from Human Preferences",
    arXiv:2310.12036, Eq. 17), TRL's `loss_type="ipo"`:

        h' = (log pi - log pi_ref)(y_c) / |y_c| - (log pi - log pi_ref)(y_r) / |y_r|
        l  = (h' - (1/2 + m) / beta)^2

    A squared loss, minimal at h' = 1/(2 beta) (plus m/beta): the log-ratio gap is held at a target
    instead of growing without bound as DPO's does on deterministic preferences, so beta is the
    regulariser (tau in the paper). `length_normalize` (TRL's choice, confirmed with the IPO authors)
    averages the log-ratios per token so beta means the same for short and long completions;
    False uses the summed log-ratios (h' = h), as the paper writes it.
    """

    def __init__(self, beta: float = 0.1, length_normalize: bool = True, use_margin: bool = True):
        if beta <= 0:
            raise ValueError(f"beta must be > 0, got {beta}")
        self.beta = beta
        self.length_normalize = length_normalize
        self.use_margin = use_margin

    def __call__(self, pairs: PairLogProbs) -> PairLoss:
        pairs.log_ratio_difference()  # checks the reference is there
        chosen = pairs.chosen - pairs.ref_chosen
        rejected = pairs.rejected - pairs.ref_rejected
        if self.length_normalize:
            chosen = chosen / pairs.chosen_tokens.clamp(min=1)
            rejected = rejected / pairs.rejected_tokens.clamp(min=1)
        target = (0.5 + self._margin(pairs)) / self.beta
        losses = (chosen - rejected - target).square()
        return PairLoss(losses, *self._dpo_rewards(pairs))


class SimPOLoss(PreferenceLoss):
    """SimPO (Meng et al. 2024, "Simple Preference Optimization with a Reference-Free Reward",
    arXiv:2405.14734, Eq. 6), TRL's CPOTrainer `loss_type="simpo"` with `cpo_alpha=0`:

        r(y) = beta * log pi(y) / |y|                        (the reward: average log-prob, no reference)
        l    = -log sigmoid(r(y_c) - r(y_r) - gamma - m)

    No reference model (no reference forward or memory). gamma is the target reward margin; the paper's
    settings are beta 2-2.5 and gamma/beta 0.3-0.8 (defaults here: beta 2, gamma 1). The rewards it
    reports are r(y_c), r(y_r).
    """

    requires_reference = False

    def __init__(self, beta: float = 2.0, gamma: float = 1.0, use_margin: bool = True):
        if beta <= 0:
            raise ValueError(f"beta must be > 0, got {beta}")
        self.beta = beta
        self.gamma = gamma
        self.use_margin = use_margin

    def __call__(self, pairs: PairLogProbs) -> PairLoss:
        chosen = self.beta * pairs.chosen / pairs.chosen_tokens.clamp(min=1)
        rejected = self.beta * pairs.rejected / pairs.rejected_tokens.clamp(min=1)
        losses = -F.logsigmoid(chosen - rejected - self.gamma - self._margin(pairs))
        return PairLoss(losses, chosen.detach(), rejected.detach())


class RPOLoss(PreferenceLoss):
    """NLL-augmented DPO, RPO (Pang et al. 2024, "Iterative Reasoning Preference Optimization",
    arXiv:2404.19733, Eq. 1; TRL's `loss_type=["sigmoid", "sft"]` with weights [1, alpha]):

        l = -log sigmoid(beta * h - m)  +  alpha * -log pi(y_c) / |y_c|

    The NLL of the chosen completion (per token) keeps its likelihood from falling while DPO widens the
    gap, the failure where both rewards fall (docs/preferences.md). alpha 1.0 is the paper's value. The
    NLL is averaged per pair as the paper writes it; TRL averages over all chosen tokens of the batch
    (the same when the chosen completions have equal lengths).
    """

    def __init__(self, beta: float = 0.1, alpha: float = 1.0, use_margin: bool = True):
        if beta <= 0:
            raise ValueError(f"beta must be > 0, got {beta}")
        if alpha < 0:
            raise ValueError(f"alpha must be >= 0, got {alpha}")
        self.beta = beta
        self.alpha = alpha
        self.use_margin = use_margin

    def __call__(self, pairs: PairLogProbs) -> PairLoss:
        z = self.beta * pairs.log_ratio_difference() - self._margin(pairs)
        nll = -pairs.chosen / pairs.chosen_tokens.clamp(min=1)
        return PairLoss(-F.logsigmoid(z) + self.alpha * nll, *self._dpo_rewards(pairs))


def preference_metrics(pairs: PairLogProbs, out: PairLoss) -> dict[str, Tensor]:
    """TRL's DPO metrics over these pairs (means, detached 0-d tensors), and `loss` (the mean per-pair loss)."""
    with torch.no_grad():
        return {
            "loss": out.losses.mean(),
            "rewards/chosen": out.chosen_rewards.mean(),
            "rewards/rejected": out.rejected_rewards.mean(),
            "rewards/margins": (out.chosen_rewards - out.rejected_rewards).mean(),
            "rewards/accuracies": (out.chosen_rewards > out.rejected_rewards).float().mean(),
            "logps/chosen": pairs.chosen.mean(),
            "logps/rejected": pairs.rejected.mean(),
        }
