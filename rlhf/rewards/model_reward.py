"""Mix a reward model's scores into the rule-based scores of a rollout.

    score_i = rule_weight * rule_i + model_weight * rm_i

`rule` is the (B,) score the `RewardManager` (or `CombinedReward`) gave each response, or None when
the stage has no rule reward (a reward model alone: score_i = model_weight * rm_i), and `rm` the (B,)
`rm_scores` of `RewardModelWorker.score`. As in `score_rollout`, the mixed score sits on each
response's last valid token of `token_level_scores` (B, T), 0 elsewhere (and nowhere for an empty
response). Each part is kept per row ("reward_extra/rule/score", "reward_extra/model/score": the
rollout records show them) and averaged in metrics ("reward/rule/mean", "reward/model/mean"), as
`CombinedReward` reports its sources. With rule_weight 0 the rule is still reported: a rule that is
not trained on watches the reward model (a gold score beside the proxy).
"""

from __future__ import annotations

import torch

from rlhf.batch import Batch


def place_on_last_token(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """(B, T) zeros with scores[i] on row i's last valid response token (rows with none stay 0).

    The last position where the mask is 1, not the count of 1s minus one: a multi-turn mask has
    holes (tool results), and a score put in one would be masked away by every estimator.
    """
    token_level = torch.zeros(response_mask.shape, dtype=torch.float32)
    valid = response_mask != 0
    rows = torch.nonzero(valid.any(dim=1)).squeeze(1)
    last = response_mask.shape[1] - 1 - valid.flip(1).int().argmax(dim=1)
    token_level[rows, last[rows]] = scores[rows].float()
    return token_level


def mix_model_scores(
    rule: torch.Tensor | None,
    rm_scores: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    model_weight: float = 1.0,
    rule_weight: float = 1.0,
) -> tuple[Batch, dict[str, float]]:
    """The (B,) rule scores (None: no rule reward) and the reward model's (B,) `rm_scores` mixed by weight:
    `scores` (B,), `token_level_scores` (B, T), `rm_scores` and the per-row parts; returns them and metrics."""
    rm = rm_scores.float().reshape(-1)
    if rule is not None and rm.shape != rule.shape:
        raise ValueError(f"mix_model_scores: {rm.shape[0]} reward-model scores for {rule.shape[0]} rows")
    if not torch.isfinite(rm).all():
        raise FloatingPointError(
            "the reward model returned NaN/Inf scores; check its dtype (bf16 overflow?) and inputs"
        )
    scores = model_weight * rm
    parts = {"reward_extra/model/score": rm.tolist()}
    metrics = {"reward/model/mean": float(rm.mean()) if len(rm) else 0.0}
    if rule is not None:
        rule = rule.float()
        scores = scores + rule_weight * rule
        parts["reward_extra/rule/score"] = rule.tolist()
        metrics["reward/rule/mean"] = float(rule.mean()) if len(rule) else 0.0
    out = Batch({"scores": scores, "token_level_scores": place_on_last_token(scores, response_mask), "rm_scores": rm},
                parts)
    return out, metrics
