"""The trainer-vs-engine log-prob gap of an update, the first sign of a stale rollout engine."""

from __future__ import annotations

import torch

from rlhf.batch import Batch
from rlhf.workers.training import ModelTrainer

__all__ = ["RolloutGap"]


class RolloutGap:
    """The trainer-vs-engine log-prob gap of one update: mean and max |log pi_old - log pi_rollout|
    over response tokens (`rollout_corr/log_prob_abs_diff`, `..._max`), logged every step.

    Where it is free and right: with `old_log_probs` in the batch (off-policy updates) straight
    from them; otherwise the update is provably on-policy (one epoch, one mini-batch: no
    optimizer step before the last micro-batch), so each micro-batch's own log-probs are the
    old ones, and the gap costs no extra forward. A stale engine (a missed weight sync) shows
    here first: the gap jumps from rounding noise (~1e-6 fp32, ~1e-2 bf16) to O(1).
    """

    def __init__(self, batch: Batch, rows: torch.Tensor | None = None):
        """`rows`: (B,) bool, the rows the update trains on (the others' old log-probs may be left 0); None: all."""
        self.active = "rollout_log_probs" in batch
        self.from_old = self.active and "old_log_probs" in batch
        self.max = torch.zeros(())
        self.mean: float | None = None
        if self.from_old:
            mask = batch["response_mask"].bool()
            if rows is not None:
                mask = mask & rows[:, None]
            diff = (batch["old_log_probs"] - batch["rollout_log_probs"]).abs()[mask]
            self.mean = float(diff.mean()) if diff.numel() else 0.0
            self.max = diff.max() if diff.numel() else torch.zeros(())

    def from_micro_batch(self, log_probs: torch.Tensor, micro: Batch) -> dict[str, torch.Tensor]:
        """The micro-batch's token-mean gap (the trainer averages it over tokens); tracks the max."""
        if not self.active or self.from_old:
            return {}
        mask = micro["response_mask"].bool()
        diff = (log_probs.detach() - micro["rollout_log_probs"]).abs().masked_fill(~mask, 0.0)
        if diff.numel() == 0:
            return {}
        self.max = torch.maximum(self.max.to(diff.device), diff.max())
        return {"rollout_corr/log_prob_abs_diff": diff.sum() / mask.sum().clamp(min=1)}

    def result(self, trainer: ModelTrainer) -> dict[str, float]:
        """The max over every rank (one collective); the mean when it came from old_log_probs."""
        if not self.active:
            return {}
        peak = self.max.to(trainer.device, torch.float32).reshape(1)
        if trainer.world_size > 1:
            torch.distributed.all_reduce(peak, op=torch.distributed.ReduceOp.MAX)
        out = {"rollout_corr/log_prob_abs_diff_max": float(peak)}
        if self.mean is not None:
            out["rollout_corr/log_prob_abs_diff"] = self.mean
        return out
