"""The reward-model trainer: a one-label score head trained on preference pairs (Bradley-Terry).

batch of pairs -> update -> log -> validate (held-out accuracy, margin, chosen/rejected means) -> checkpoint;
at the end the reward mean and std over the training pairs go into the model's config, and `final/` is a
Hugging Face folder that `RewardModelWorker` loads for RL with its head intact and normalises with those
statistics (as OpenRLHF stores them). The group is a `RewardModelWorker` group built with a loss
(rlhf_configs.reward_model.rm_stage); gradient accumulation, the LR schedule and data parallelism are its
`ModelTrainer`'s, as in the SFT stage. A pair's two rows carry one `uid` (`PreferenceDataset`), so the group
shards whole pairs and the worker keeps them in one micro-batch.
"""

from __future__ import annotations

import time

import torch

from rlhf.algos import BradleyTerryLoss
from rlhf.batch import Batch
from rlhf.data.preferences import PreferenceDataset
from rlhf.ranges import NonNegativeInt, PositiveFloat, PositiveInt
from rlhf.trainers.context import StageContext
from rlhf.trainers.metrics import mean_over_ranks
from rlhf.trainers.supervised_loop import SupervisedLoop


def pair_scores(rm, data: PreferenceDataset, batch_size: int, limit: int | None = None) -> torch.Tensor:
    """(N, 2) raw scores (chosen, rejected) of the first `limit` pairs of `data` (None: all), in order."""
    parts, seen = [], 0
    for batch in data.in_order(batch_size):
        if limit is not None and seen >= limit:
            break
        if limit is not None and seen + len(batch) // 2 > limit:
            batch = batch.index(slice(0, 2 * (limit - seen)))
        scores = rm.compute_scores(batch)["rm_scores"].float()
        parts.append(scores.reshape(-1, 2))
        seen += len(scores) // 2
    return torch.cat(parts) if parts else torch.zeros(0, 2)


def heldout_metrics(scores: torch.Tensor) -> dict[str, float]:
    """Held-out metrics of (N, 2) scores (chosen, rejected): `rm/accuracy` (the fraction of pairs whose chosen
    side scores strictly higher, TRL's accuracy), `rm/margin` (mean chosen - rejected), `rm/chosen_mean`,
    `rm/rejected_mean`, and `val/rm_loss`, the mean Bradley-Terry loss -log sigmoid(chosen - rejected)
    (no margin: what the held-out ranking costs)."""
    _, metrics = BradleyTerryLoss()(scores[:, 0], scores[:, 1])
    names = {"loss": "val/rm_loss", "accuracy": "rm/accuracy", "margin": "rm/margin"}
    return {names.get(k, f"rm/{k}"): float(v) for k, v in metrics.items()}


class RewardModelTrainer(SupervisedLoop):
    """Trains the reward-model group (RewardModelWorker with a loss) for `total_steps` batches of pairs (the loop,
    checkpoints and exact resume: `SupervisedLoop`)."""

    loss_metric = "rm/loss"
    part = "rm"
    weights_name = "the reward model's weights"

    def __init__(
        self,
        rm,  # WorkerGroup of RewardModelWorker built with a `loss`
        data: PreferenceDataset,
        batch_size: PositiveInt = 64,  # pairs per optimizer step, over all data-parallel workers (a multiple of them)
        total_steps: PositiveInt = 500,
        val_data: PreferenceDataset | None = None,  # held-out pairs for rm/accuracy, rm/margin, ...; None: none
        val_batch_size: PositiveInt = 64,  # pairs per scoring call of the validation
        test_freq: NonNegativeInt = 0,  # validate every k steps (0: only at the end); always at the end
        val_before_train: bool = False,  # also validate the initial model (logged at step 0)
        bucketed: bool = True,  # batches of pairs of similar lengths (less padding); False: random
        # the reward mean and std stored with the model are over this many training pairs (both sides), in order;
        # None: all of them
        stats_pairs: PositiveInt | None = 2048,
        save_freq: NonNegativeInt = 0,  # full checkpoint every k steps and at the end (0: none; `final/` is always written)
        keep_checkpoints: PositiveInt = 2,  # complete checkpoints kept (oldest deleted)
        # stop after the step that spends this many minutes of training (rlhf.trainers.time_budget); None: total_steps
        max_train_minutes: PositiveFloat | None = None,
        seed: NonNegativeInt = 0,
    ):
        if batch_size % rm.world_size:
            raise ValueError(f"RewardModelTrainer: batch_size={batch_size} pairs do not split evenly over "
                             f"{rm.world_size} reward-model workers (each takes whole pairs); use a multiple of "
                             f"{rm.world_size}")
        super().__init__(data, batch_size=batch_size, total_steps=total_steps, val_data=val_data,
                         val_batch_size=val_batch_size, test_freq=test_freq, val_before_train=val_before_train,
                         bucketed=bucketed, save_freq=save_freq, keep_checkpoints=keep_checkpoints,
                         max_train_minutes=max_train_minutes, seed=seed)
        self.rm = rm
        self.stats_pairs = stats_pairs

    @property
    def trained(self):
        return self.rm

    def finish(self, ctx: StageContext, metrics: dict[str, float]) -> dict:
        """The reward mean and std into the model's config, then `final/`."""
        mean, std = self.reward_stats()
        self.rm.set_reward_stats(mean, std)
        checkpoint = self.rm.save(str(ctx.out_dir / "final"))[0]
        return {"checkpoint": checkpoint, "metrics": metrics, "reward_mean": mean, "reward_std": std}

    def step(self, batch: Batch) -> dict[str, float]:
        start = time.perf_counter()
        metrics = mean_over_ranks(self.rm.update(batch))
        metrics["timing_s/step"] = time.perf_counter() - start
        metrics["perf/total_num_tokens"] = float(batch["attention_mask"].sum())
        return metrics

    def validate(self) -> dict[str, float]:
        """The held-out metrics over every pair of `val_data` (`heldout_metrics`)."""
        return heldout_metrics(pair_scores(self.rm, self.val_data, self.val_batch_size))

    def reward_stats(self) -> tuple[float, float]:
        """(mean, std) of the trained model's raw scores over both sides of the first `stats_pairs` training pairs."""
        scores = pair_scores(self.rm, self.data, self.val_batch_size, self.stats_pairs).reshape(-1)
        std = float(scores.std()) if scores.numel() > 1 else 1.0
        return float(scores.mean()), std if std > 0 else 1.0
