"""The Bradley-Terry loss of a reward model trained on preference pairs.

Notation: P pairs; r_c, r_r (P,) the model's scalar rewards of the chosen and rejected completions.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from rlhf.algos.frozen import Frozen


class BradleyTerryLoss(Frozen):
    """Pairwise reward-model loss (Bradley & Terry 1952; InstructGPT, Ouyang et al. 2022, arXiv:2203.02155):

        l_i  = -log sigmoid(r_c,i - r_r,i - m_i)                  (m_i = 0 without a margin)
        loss = sum_i l_i / num_pairs  +  c * sum_i (r_c,i + r_r,i)^2 / num_pairs

    The margin m (Llama 2, Touvron et al. 2023, arXiv:2307.09288) asks a pair rated as clearly
    better to be separated by more than one rated as slightly better. The centring term
    (Eisenstein et al. 2023, arXiv:2312.09244; TRL's `center_rewards_coefficient`) pulls the
    rewards' mean towards 0, since the loss alone only fixes reward differences: an offset then
    cannot drift, and the rewards a PPO stage reads stay near zero. With `num_pairs` the pairs of
    the whole batch (all ranks and micro-batches), summing the micro-batch losses gives the batch
    loss; left out, it is this call's pair count (TRL's RewardTrainer: a mean).

    center_rewards_coefficient: c; None: no centring term (TRL's default; 0.01 is its documented value).
    Called (chosen_rewards (P,), rejected_rewards (P,), margin (P,) or None, *, num_pairs) ->
    (loss, metrics); metrics (means over this call's pairs, detached): `loss` (the Bradley-Terry term),
    `accuracy` (share of pairs with r_c > r_r), `margin` (mean r_c - r_r), `chosen_mean`, `rejected_mean`.
    """

    def __init__(self, center_rewards_coefficient: float | None = None):
        if center_rewards_coefficient is not None and center_rewards_coefficient < 0:
            raise ValueError(f"center_rewards_coefficient must be >= 0 (or None), got {center_rewards_coefficient}")
        self.center_rewards_coefficient = center_rewards_coefficient

    def __call__(
        self,
        chosen_rewards: Tensor,
        rejected_rewards: Tensor,
        margin: Tensor | None = None,
        *,
        num_pairs: float | None = None,
    ) -> tuple[Tensor, dict[str, Tensor]]:
        diff = chosen_rewards - rejected_rewards
        per_pair = -F.logsigmoid(diff - margin if margin is not None else diff)
        denominator = float(num_pairs) if num_pairs is not None else float(max(len(diff), 1))
        loss = per_pair.sum() / denominator
        if self.center_rewards_coefficient is not None:
            loss = loss + self.center_rewards_coefficient * (chosen_rewards + rejected_rewards).square().sum() / denominator
        with torch.no_grad():
            metrics = {
                "loss": per_pair.mean(),
                "accuracy": (diff > 0).float().mean(),
                "margin": diff.mean(),
                "chosen_mean": chosen_rewards.mean(),
                "rejected_mean": rejected_rewards.mean(),
            }
        return loss, metrics

    def __repr__(self) -> str:
        return f"BradleyTerryLoss(center_rewards_coefficient={self.center_rewards_coefficient})"
