"""The loop every supervised stage shares: SFT, DPO (an SFT stage with another objective) and the reward model.

resume from the newest intact checkpoint -> record the data's fingerprints -> (validate the start) -> per step:
a batch, an update, its metrics, validation every `test_freq` steps and at the end, a checkpoint every
`save_freq` steps and at the end -> the stage's `final/` folder. The end is `total_steps`, or the step that spends
`max_train_minutes` (`TimeBudget`). The step is the data position (`shuffled(start_step=...)`),
so a run killed anywhere resumes exactly. A stage says what it trains (`trained`, kept in the checkpoint's
`part` subfolder), how it steps and validates, and what its end writes (`finish`); the rest is decided here once.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from rlhf.trainers.checkpoint import CheckpointManager
from rlhf.trainers.context import StageContext
from rlhf.trainers.time_budget import TimeBudget


class SupervisedLoop(ABC):
    """Base of the supervised trainers; a subclass passes its loop settings to `__init__` and sets the class
    attributes below."""

    loss_metric: str  # shown on the progress bar
    part: str  # the checkpoint subfolder of the trained group's state ("policy", "rm")
    weights_name: str  # in the error that refuses a checkpoint of non-finite weights

    def __init__(self, data: Any, *, batch_size: int, total_steps: int, val_data: Any, val_batch_size: int,
                 test_freq: int, val_before_train: bool, bucketed: bool, save_freq: int, keep_checkpoints: int,
                 max_train_minutes: float | None, seed: int):
        """The settings every supervised stage has (each subclass's signature documents them). `data`: training
        rows with `fingerprint` and `shuffled(batch_size, seed, start_step=, bucketed=)`."""
        self.data = data
        self.batch_size = batch_size
        self.total_steps = total_steps
        self.val_data = val_data
        self.val_batch_size = val_batch_size
        self.test_freq = test_freq
        self.val_before_train = val_before_train
        self.bucketed = bucketed
        self.save_freq = save_freq
        self.keep_checkpoints = keep_checkpoints
        self.budget = TimeBudget(max_train_minutes)  # spent time is kept in checkpoints
        self.seed = seed
        self._metrics: dict[str, float] = {}  # the last step's metrics (saved with each checkpoint)

    @property
    @abstractmethod
    def trained(self):
        """The worker group this stage trains."""

    def validates(self) -> bool:
        """Whether the stage has anything to validate (held-out rows, an evaluator)."""
        return self.val_data is not None

    @abstractmethod
    def step(self, batch) -> dict[str, float]:
        """One optimizer step on `batch`; its metrics."""

    @abstractmethod
    def validate(self) -> dict[str, float]:
        """The held-out metrics."""

    @abstractmethod
    def finish(self, ctx: StageContext, metrics: dict[str, float]) -> dict:
        """Write `final/` and return the stage's result (at least "checkpoint" and "metrics")."""

    def run(self, ctx: StageContext) -> dict:
        checkpoints = CheckpointManager(ctx.out_dir / "checkpoints", keep=self.keep_checkpoints)
        checkpoints.remove_partial()  # what a kill during a save left behind
        start = self.restore(checkpoints, ctx) if ctx.resume else 0
        fingerprints = {"train": self.data.fingerprint}
        if self.val_data is not None:
            fingerprints["val"] = self.val_data.fingerprint
        ctx.record({"data": fingerprints})
        if self.val_before_train and start == 0 and self.validates():
            ctx.log(self.validate(), 0)
        batches = self.data.shuffled(self.batch_size, self.seed, start_step=start, bucketed=self.bucketed)
        end = start if self.budget.exhausted else self.total_steps  # resumed after the budget was spent: no steps
        bar = tqdm(range(start + 1, end + 1), initial=start, total=self.total_steps,
                   desc=ctx.name, disable=not ctx.progress, mininterval=1.0)
        metrics = self._metrics  # a run resumed at its last step reports that step's metrics
        step = start
        for step in bar:
            metrics = self.step(next(batches))
            metrics.update(self.budget.spend(metrics))
            last = step == self.total_steps or self.budget.exhausted
            if self.validates() and (last or (self.test_freq and step % self.test_freq == 0)):
                metrics.update(self.validate())
            ctx.log(metrics, step)
            self._metrics = metrics
            if self.save_freq and (step % self.save_freq == 0 or last):
                self.save(checkpoints, step)
            bar.set_postfix(loss=f"{metrics[self.loss_metric]:.3f}", refresh=False)
            if last:
                break
        return {**self.finish(ctx, metrics), **self.budget.stopped_early(step, self.total_steps)}

    # -------------------------------------------------------- checkpoints
    def save(self, checkpoints: CheckpointManager, step: int) -> Path:
        if not all(self.trained.weights_finite()):
            raise FloatingPointError(
                f"{self.weights_name} are not finite at step {step}; refusing to write a checkpoint. "
                f"Resume from {checkpoints.latest() or 'the start'} with a lower learning rate."
            )
        return checkpoints.save(step, lambda folder: self.trained.save_state(str(folder / self.part)),
                                {"metrics": self._metrics, "time_budget": self.budget.state_dict()})

    def restore(self, checkpoints: CheckpointManager, ctx: StageContext) -> int:
        """Load the newest intact checkpoint, if any (broken ones are set aside with a warning and
        recorded in the run as `resume.skipped`); returns the step to continue after."""
        folder, state, skipped = checkpoints.resume(lambda f: self.trained.load_state(str(f / self.part)))
        if folder is not None or skipped:
            ctx.record({"resume": {"from": str(folder), "skipped": skipped}})
        self._metrics = dict(state.get("metrics") or {})
        self.budget.load_state_dict(state.get("time_budget") or {})
        return int(state["step"])
