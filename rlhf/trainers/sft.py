"""The SFT trainer: supervised fine-tuning of the policy group on response tokens only.

batch -> update -> log (loss, padding) -> validate (held-out loss, exact match) -> checkpoint.
Gradient accumulation is the policy worker's (`micro_batch_size` below `batch_size`), the LR
schedule is its `lr_scheduler`, data parallelism is the group's `num_workers`. The `final/`
folder is a Hugging Face model that an RL stage starts from (`StageOutput(stage="sft")`),
which also makes this stage's run the RL run's parent in Aim.
"""

from __future__ import annotations

import time

from rlhf.data.sft import SFTDataset, padding_fraction
from rlhf.ranges import NonNegativeInt, PositiveFloat, PositiveInt
from rlhf.trainers.context import StageContext
from rlhf.trainers.evaluate import Evaluator
from rlhf.trainers.metrics import mean_over_ranks
from rlhf.trainers.supervised_loop import SupervisedLoop


def validation_loss(policy, data: SFTDataset, batch_size: int) -> dict[str, float]:
    """`val/sft_loss`: mean NLL per trained token over all of `data`, with no gradient.

    loss = sum_{b,t} -log p(y_bt) m_bt / sum_{b,t} m_bt, with log p from the policy's
    `compute_log_probs` (B,T) and m the response_mask (B,T): the training loss on held-out data.
    """
    nll, tokens = 0.0, 0.0
    for batch in data.in_order(batch_size):
        log_probs = policy.compute_log_probs(batch)["old_log_probs"]
        mask = batch["response_mask"].to(log_probs.dtype)
        nll += float(-(log_probs * mask).sum())
        tokens += float(mask.sum())
    return {"val/sft_loss": nll / max(tokens, 1.0)}


class SFTTrainer(SupervisedLoop):
    """Trains the policy group (built with an SFTObjective) for `total_steps` batches (the loop, checkpoints and
    exact resume: `SupervisedLoop`)."""

    loss_metric = "sft/loss"  # shown on the progress bar
    part = "policy"
    weights_name = "the policy weights"

    def __init__(
        self,
        policy,  # WorkerGroup of PolicyWorker with objective=SFTObjective()
        data: SFTDataset,
        batch_size: PositiveInt = 128,  # examples per optimizer step, over all data-parallel workers
        total_steps: PositiveInt = 500,
        evaluator: Evaluator | None = None,  # generation-based exact match on held-out prompts
        val_data: SFTDataset | None = None,  # held-out examples for `val/sft_loss`; None: no val loss
        val_batch_size: PositiveInt = 64,  # examples per log-prob call of the validation loss
        test_freq: NonNegativeInt = 0,  # validate every k steps (0: only at the end); always at the end
        val_before_train: bool = False,  # also validate the initial model (logged at step 0)
        bucketed: bool = True,  # batches of similar lengths (less padding; see length_bucketed_batches); False: random
        save_freq: NonNegativeInt = 0,  # full checkpoint every k steps and at the end (0: none; `final/` is always written)
        keep_checkpoints: PositiveInt = 2,  # complete checkpoints kept (oldest deleted)
        # stop after the step that spends this many minutes of training (rlhf.trainers.time_budget); None: total_steps
        max_train_minutes: PositiveFloat | None = None,
        seed: NonNegativeInt = 0,
    ):
        super().__init__(data, batch_size=batch_size, total_steps=total_steps, val_data=val_data,
                         val_batch_size=val_batch_size, test_freq=test_freq, val_before_train=val_before_train,
                         bucketed=bucketed, save_freq=save_freq, keep_checkpoints=keep_checkpoints,
                         max_train_minutes=max_train_minutes, seed=seed)
        self.policy = policy
        self.evaluator = evaluator

    @property
    def trained(self):
        return self.policy

    def validates(self) -> bool:
        return self.val_data is not None or self.evaluator is not None

    def finish(self, ctx: StageContext, metrics: dict[str, float]) -> dict:
        return {"checkpoint": self.policy.save(str(ctx.out_dir / "final"))[0], "metrics": metrics}

    def step(self, batch) -> dict[str, float]:
        start = time.perf_counter()
        metrics = mean_over_ranks(self.policy.update(batch))
        metrics["timing_s/step"] = time.perf_counter() - start
        metrics["sft/padding_frac"] = padding_fraction(batch)
        metrics["sft/num_tokens"] = float(batch["response_mask"].sum())
        metrics["perf/total_num_tokens"] = float(batch["attention_mask"].sum())
        return metrics

    def validate(self) -> dict[str, float]:
        metrics: dict[str, float] = {}
        if self.val_data is not None:
            metrics.update(validation_loss(self.policy, self.val_data, self.val_batch_size))
        if self.evaluator is not None:
            metrics.update(self.evaluator(self.policy))
        return metrics
