"""CriticWorker: values on response positions only, and the clipped value loss lowers with training."""

import torch

from rlhf.workers.critic import CriticWorker
from rlhf.workers.training import TrainingSetup
from helpers import grpo_worker, scored_rollout, tiny_model_path


def test_values_are_masked_and_training_fits_returns():
    batch = scored_rollout(grpo_worker(), prompts=4, n=2)
    critic = CriticWorker(tiny_model_path(), optimizer=lambda p: torch.optim.AdamW(p, lr=1e-2),
                          training=TrainingSetup(micro_batch_size=4))
    values = critic.compute_values(batch)["values"]
    assert values.shape == batch["responses"].shape
    assert values[batch["response_mask"] == 0].eq(0).all()
    batch["values"] = values
    batch["returns"] = torch.ones_like(values) * batch["response_mask"]
    losses = [critic.update(batch)["critic/vf_loss"] for _ in range(8)]
    assert losses[-1] < losses[0]
    assert critic.weights_finite() is True
