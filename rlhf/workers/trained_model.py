"""What every worker that trains one model (`self.trainer`, a `rlhf.workers.training.ModelTrainer`) answers the
same way: its resume state, the finite-weights guard before a checkpoint, and the digest runs and ranks are
compared with. Mixed into the policy, critic and reward-model workers, so each is decided once."""

from __future__ import annotations

import torch

from rlhf.workers.dispatch import on_all_ranks
from rlhf.workers.fsdp import full_tensor


class TrainsOneModel:
    """Mixed into a worker whose `self.trainer` trains its model."""

    trainer: object  # rlhf.workers.training.ModelTrainer, set by the worker's __init__

    @on_all_ranks
    def save_state(self, path: str) -> None:
        """Trained weights, optimizer, LR schedule and RNG states for an exact resume (rlhf.workers.state_io)."""
        self.trainer.save_state(path)

    @on_all_ranks
    def load_state(self, path: str) -> None:
        self.trainer.load_state(path)

    @on_all_ranks
    def weights_finite(self) -> bool:
        return self.trainer.parameters_finite()

    @on_all_ranks
    def parameters_digest(self) -> dict[str, torch.Tensor]:
        """A copy of the model's parameters, gathered from FSDP shards (tests compare runs and ranks with it)."""
        return {k: full_tensor(v).detach().cpu().clone() for k, v in self.trainer.unwrapped().state_dict().items()}
