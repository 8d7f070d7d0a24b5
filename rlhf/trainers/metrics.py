"""verl-named metrics of a scored rollout batch (scores, rewards, advantages, lengths)."""

from __future__ import annotations

import torch

from rlhf.algos import masked_mean
from rlhf.batch import Batch


def _stats(prefix: str, values: torch.Tensor) -> dict[str, float]:
    if values.numel() == 0:
        return {}
    v = values.float()
    return {f"{prefix}/mean": float(v.mean()), f"{prefix}/max": float(v.max()), f"{prefix}/min": float(v.min())}


def response_lengths(batch: Batch) -> torch.Tensor:
    """(B,) each response's length as generated (EOS included): the attention mask over the response columns
    (as many as `response_mask` has; its values, the tokens trained on, rollout correction may lower)."""
    width = batch["response_mask"].shape[1]
    return batch["attention_mask"][:, batch["attention_mask"].shape[1] - width:].sum(dim=1)


def rollout_metrics(batch: Batch, max_new_tokens: int) -> dict[str, float]:
    mask = batch["response_mask"].bool()  # the tokens trained on (rollout correction may reject some)
    lengths = response_lengths(batch)
    metrics = {
        **_stats("critic/score", batch["token_level_scores"].sum(dim=1)),
        **_stats("response_length", lengths),
        "response_length/clip_ratio": float((lengths >= max_new_tokens).float().mean()),
        **_stats("prompt_length", batch["attention_mask"].sum(dim=1) - lengths),
    }
    if "token_level_rewards" in batch:
        metrics.update(_stats("critic/rewards", batch["token_level_rewards"].sum(dim=1)))
    if "advantages" in batch:
        metrics.update(_stats("critic/advantages", batch["advantages"][mask]))
        metrics.update(_stats("critic/returns", batch["returns"][mask]))
    if "values" in batch:
        values, returns = batch["values"][mask], batch["returns"][mask]
        metrics.update(_stats("critic/values", values))
        # 1 - Var(returns - values) / Var(returns): 1 is a perfect critic, <= 0 is useless
        metrics["critic/vf_explained_var"] = float(1 - (returns - values).var() / returns.var().clamp(min=1e-8))
    if "rollout_log_probs" in batch and "old_log_probs" in batch:
        gap = (batch["old_log_probs"] - batch["rollout_log_probs"]).abs()
        metrics["rollout_corr/log_prob_abs_diff"] = float(masked_mean(gap, mask.float()))
    return metrics


def mean_over_ranks(per_rank: list[dict[str, float]]) -> dict[str, float]:
    """Average each metric over data-parallel ranks (their shards have equal sizes)."""
    keys = per_rank[0].keys()
    return {k: sum(r[k] for r in per_rank) / len(per_rank) for k in keys}
