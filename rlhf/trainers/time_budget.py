"""A stage's training time budget: stop after the step that spends it, so runs compared side by side (a sweep, a
panel of tasks, a job with a fixed allocation) get equal minutes rather than equal steps (Lightning's `max_time`).

Counted over the steps' own time (`timing_s/step`: rollout, scoring and update), not validation or checkpoints,
so how often a run validates does not change how much it trains. The step that spends the budget is the stage's
last: it is validated and checkpointed as the step `total_steps` would be. The spent time is kept in each
checkpoint, so a resumed run trains only for what is left. The learning-rate schedule still runs over
`total_steps`: a run the budget stops ends before its schedule does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping


@dataclasses.dataclass
class TimeBudget:
    """`minutes` of training (None: no budget) and the seconds spent so far."""

    minutes: float | None = None
    spent_s: float = 0.0

    def __post_init__(self) -> None:
        if self.minutes is not None and not self.minutes > 0:
            raise ValueError(f"max_train_minutes={self.minutes}: a training time budget must be above 0 minutes "
                             "(None: no budget, the stage runs total_steps)")

    def spend(self, step_metrics: Mapping[str, float]) -> dict[str, float]:
        """Count one step's `timing_s/step`; the metric of the training seconds spent so far (a timing, so
        `timing_s/`: comparisons of runs that must match leave those out)."""
        self.spent_s += float(step_metrics["timing_s/step"])
        return {"timing_s/train_total": self.spent_s}

    @property
    def exhausted(self) -> bool:
        return self.minutes is not None and self.spent_s >= self.minutes * 60

    def stopped_early(self, step: int, total_steps: int) -> dict:
        """What the stage's result says when the budget ended it before `total_steps` (else nothing)."""
        if not self.exhausted or step >= total_steps:
            return {}
        return {"stopped_early": {"reason": f"max_train_minutes={self.minutes} spent", "step": step,
                                  "total_steps": total_steps, "train_minutes": round(self.spent_s / 60, 3)}}

    def state_dict(self) -> dict[str, float]:
        return {"spent_s": self.spent_s}

    def load_state_dict(self, state: Mapping[str, float]) -> None:
        self.spent_s = float(state.get("spent_s", 0.0))
