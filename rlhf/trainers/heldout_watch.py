"""What the RL trainer watches in its held-out evaluations: a reward being gamed, and the best step.

Pure bookkeeping (no torch, no files): the trainer feeds it numbers and acts on what it says.

**The alarm.** Each evaluation i gives a point (step_i, t_i, h_i): h_i the held-out score, t_i the
training score over the interval since the evaluation before (the mean of the steps'
`critic/score/mean`; None for an evaluation with no training step before it, e.g. before
training). Evaluation i *regressed* when the held-out score fell while the training score rose:

    h_i < h_(i-1)  and  t_i > t_(i-1)      (both t known)

`RegressionAlarm` warns at every evaluation that ends a run of at least `evaluations` (K)
regressed evaluations in a row, i.e. K+1 points whose held-out scores fall and whose training
scores rise all the way. Averaging the training score over the interval keeps one noisy step
from starting or breaking a run.

**Below the start.** A policy can also learn to guess: its training score stays up while its held-out score
drops once and stays down (a single fall, so no run of falls). The same alarm warns when the last K
evaluations after training began all lie more than `margin` below the first evaluation (before training, with
`val_before_train`):

    h_j < h_0 - margin  for each of the last K evaluations j, each with a training score

The margin (0.05 by default) keeps the noise of one greedy evaluation of a few hundred rows from firing it;
requiring K evaluations keeps a dip while the policy learns a format from firing it.

**One answer to every question.** A reward that pays only for right answers can also be raised by answering
every question with the most common right answer: where "1" is right for 60% of the questions, a policy that
always says "1" scores 60%, above a base model's 50%, and the held-out score rises with the training score, so
neither rule above fires. The evaluator reports how spread out each source's held-out answers are
(`val-aux/<source>/answers/top_share`, the share giving the most common answer, beside `truth_top_share`, the
share of rows whose right answer is the most common one). An evaluation after training began *collapsed* for a
source when

    top_share >= collapse > truth_top_share        (collapse: 0.9 by default)

i.e. nearly every held-out question got the same answer although their right answers differ: the policy has
learnt the most common answer, not the task, and its held-out score is capped at `truth_top_share`. A collapsed
evaluation is never kept as `best/`, however high its score (with the collapse rule on): the letter-counting policy
above would otherwise be the run's best model.

**Answers cut by the budget.** A response budget shorter than the model's way of answering cuts its answers
before their final line, so right answers score nothing and the reward teaches the model to answer in fewer
tokens than it can be right in. The evaluator reports the share of each source's held-out responses that
reached the budget (`val-aux/<source>/response_length/clip_ratio`); at any evaluation, the one before training
included (when the budget is cheapest to fix), a source whose share is at least `cut` (0.1 by default) warns.
"""

from __future__ import annotations

import dataclasses

from rlhf.ranges import PositiveInt

GAMED_REWARD_DOC = "docs/debugging.md#the-held-out-score-falls-while-the-training-score-rises"
BELOW_START_DOC = "docs/debugging.md#the-held-out-score-stays-below-its-start"
COLLAPSE_DOC = "docs/debugging.md#every-question-gets-the-same-answer"
BUDGET_DOC = "docs/debugging.md#answers-reach-the-response-budget"
SPREAD_PREFIX, TOP_SHARE, TRUTH_TOP_SHARE = "val-aux/", "/answers/top_share", "/answers/truth_top_share"
CLIP_RATIO = "/response_length/clip_ratio"
COLLAPSE = 0.9
"""The default top_share at which held-out answers have collapsed onto one (`RegressionAlarm(collapse=...)`)."""


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """One held-out evaluation: its step, the interval's training score (None: no steps before it), the score."""

    step: int
    train: float | None
    heldout: float


@dataclasses.dataclass(frozen=True)
class Regression:
    """K+1 evaluations in a row whose held-out score fell while the training score rose."""

    metric: str  # the held-out metric, e.g. "val-core/arithmetic/reward/mean@1"
    evaluations: tuple[Evaluation, ...]

    def warning(self) -> str:
        """The one-line warning naming both curves."""
        points = self.evaluations
        held = " -> ".join(f"{p.heldout:.3g}" for p in points)
        train = " -> ".join(f"{p.train:.3g}" for p in points)
        return (
            f"warning: held-out {self.metric} fell {held} over steps {points[0].step}-{points[-1].step} while the "
            f"training score (critic/score/mean between evaluations) rose {train}: the reward may be gamed "
            f"({GAMED_REWARD_DOC})"
        )


@dataclasses.dataclass(frozen=True)
class BelowStart:
    """The last K evaluations after training began, all more than `margin` below the first evaluation."""

    metric: str
    start: Evaluation
    evaluations: tuple[Evaluation, ...]
    margin: float

    def warning(self) -> str:
        """The one-line warning naming the start, the evaluations below it, and the training score."""
        points = self.evaluations
        held = " -> ".join(f"{p.heldout:.3g}" for p in points)
        train = " -> ".join(f"{p.train:.3g}" for p in points)
        steps = f"step {points[0].step}" if len(points) == 1 else f"steps {points[0].step}-{points[-1].step}"
        return (
            f"warning: held-out {self.metric} is {held} at {steps}, more than "
            f"{self.margin:.3g} below its {self.start.heldout:.3g} at step {self.start.step}, while the training "
            f"score (critic/score/mean between evaluations) is {train}: training has made the model worse on "
            f"held-out rows; the policy may have learnt to guess (see val-aux/<source>/answers/top_share) "
            f"({BELOW_START_DOC})"
        )


@dataclasses.dataclass(frozen=True)
class Collapse:
    """One source's held-out answers at an evaluation after training began: nearly all the same, where the right
    answers differ."""

    source: str
    step: int
    top_share: float
    truth_top_share: float

    def warning(self) -> str:
        return (
            f"warning: at step {self.step} the policy gives one answer to {self.top_share:.0%} of the held-out "
            f"{self.source} questions (val-aux/{self.source}/answers/top_share), whose right answers agree only "
            f"{self.truth_top_share:.0%} of the time (truth_top_share): it has learnt the most common answer, not "
            f"the task, and its held-out score cannot pass {self.truth_top_share:.0%} that way; this evaluation is "
            f"not kept as best/ ({COLLAPSE_DOC})"
        )


def per_source(metrics: dict[str, float], suffix: str) -> dict[str, float]:
    """`val-aux/<source><suffix>` values by source, in source order."""
    return {key[len(SPREAD_PREFIX):-len(suffix)]: float(value) for key, value in sorted(metrics.items())
            if key.startswith(SPREAD_PREFIX) and key.endswith(suffix)}


def collapses(step: int, metrics: dict[str, float], collapse: float) -> dict[str, Collapse | None]:
    """Each source whose evaluation reports its answers' spread: its collapse (module docstring), or None."""
    truths = per_source(metrics, TRUTH_TOP_SHARE)
    return {source: Collapse(source, step, top, truths[source])
            if source in truths and top >= collapse > truths[source] else None
            for source, top in per_source(metrics, TOP_SHARE).items()}


@dataclasses.dataclass(frozen=True)
class BudgetCut:
    """One source's held-out responses at an evaluation: too many reached the response budget."""

    source: str
    step: int
    clip_ratio: float

    def warning(self) -> str:
        return (
            f"warning: at step {self.step} {self.clip_ratio:.0%} of the held-out {self.source} responses reached the "
            f"response budget (val-aux/{self.source}/response_length/clip_ratio): an answer cut there loses its "
            f"final line, so right answers score nothing; measure the model's answer lengths with `rlhf probe` and "
            f"raise max_new_tokens ({BUDGET_DOC})"
        )


def budget_cuts(step: int, metrics: dict[str, float], cut: float) -> dict[str, BudgetCut | None]:
    """Each source whose evaluation reports its responses' clip ratio: its `BudgetCut` (module docstring), or None."""
    return {source: BudgetCut(source, step, ratio) if ratio >= cut else None
            for source, ratio in per_source(metrics, CLIP_RATIO).items()}


def regressed(before: Evaluation, now: Evaluation) -> bool:
    """Whether the held-out score fell from `before` to `now` while the training score rose."""
    if before.train is None or now.train is None:
        return False
    return now.heldout < before.heldout and now.train > before.train


class RegressionAlarm:
    """Fed one `Evaluation` at a time; says when the held-out score has fallen for K evaluations in a row
    while the training score rose, and (`below_start`) when it has stayed below its start (the module docstring
    has both rules)."""

    def __init__(
        self,
        evaluations: PositiveInt = 2,  # K: regressed (or below-start) evaluations in a row before it warns
        margin: float | None = 0.05,  # how far below the first evaluation (metric units) is below the start; None: off
        collapse: float | None = COLLAPSE,  # top_share at or above it (and above truth_top_share) is a collapse; None: off
        cut: float | None = 0.1,  # a share of held-out responses at the budget that warns; None: off
    ):
        if evaluations < 1:
            raise ValueError(f"RegressionAlarm: evaluations must be >= 1 (regressed evaluations in a row), "
                             f"got {evaluations}")
        if margin is not None and not margin >= 0:
            raise ValueError(f"RegressionAlarm: margin must be >= 0 (a drop of the held-out score below its first "
                             f"evaluation, in the metric's units), or None to turn the below-start rule off; got {margin}")
        if collapse is not None and not 0 < collapse <= 1:
            raise ValueError(f"RegressionAlarm: collapse must be in (0, 1] (the share of held-out questions given one "
                             f"answer that counts as a collapse), or None to turn that rule off; got {collapse}")
        if cut is not None and not 0 < cut <= 1:
            raise ValueError(f"RegressionAlarm: cut must be in (0, 1] (the share of held-out responses reaching the "
                             f"response budget that warns), or None to turn that rule off; got {cut}")
        self.evaluations = evaluations
        self.margin = margin
        self.collapse = collapse
        self.cut = cut
        self.history: list[Evaluation] = []
        self.streak = 0  # regressed evaluations in a row up to the last one

    def update(self, metric: str, evaluation: Evaluation) -> Regression | None:
        """Record `evaluation`; the regression it ends, if the run of regressed evaluations reached K."""
        if self.history and regressed(self.history[-1], evaluation):
            self.streak += 1
        else:
            self.streak = 0
        self.history.append(evaluation)
        if self.streak < self.evaluations:
            return None
        return Regression(metric, tuple(self.history[-(self.evaluations + 1):]))

    def below_start(self, metric: str) -> BelowStart | None:
        """After `update`: whether the last K evaluations all lie more than the margin below the first one
        (each after training began); None when not, or when the rule is off."""
        if self.margin is None or len(self.history) <= self.evaluations:
            return None
        start, last = self.history[0], self.history[-self.evaluations:]
        if all(e.train is not None and e.heldout < start.heldout - self.margin for e in last):
            return BelowStart(metric, start, tuple(last), self.margin)
        return None

    def state_dict(self) -> dict:
        return {"history": [dataclasses.asdict(e) for e in self.history], "streak": self.streak}

    def load_state_dict(self, state: dict) -> None:
        self.history = [Evaluation(**e) for e in state.get("history", [])]
        self.streak = int(state.get("streak", 0))


class IntervalMean:
    """The mean of the training scores added since the last `take()` (the training score of an interval)."""

    def __init__(self) -> None:
        self.total = 0.0
        self.count = 0

    def add(self, score: float) -> None:
        self.total += score
        self.count += 1

    def take(self) -> float | None:
        """The interval's mean (None: no step in it), and a new interval starts."""
        mean = self.total / self.count if self.count else None
        self.total, self.count = 0.0, 0
        return mean


@dataclasses.dataclass
class BestHeldout:
    """The evaluation with the highest held-out score so far (ties keep the earlier one: fewer steps)."""

    step: int | None = None
    score: float | None = None

    def update(self, step: int, score: float) -> bool:
        """Record an evaluation; True when it is a new best (its checkpoint should be kept)."""
        if self.score is not None and score <= self.score:
            return False
        self.step, self.score = step, score
        return True


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What one evaluation means for the run: metrics to log, whether to keep its weights as `best/`, a warning."""

    metrics: dict[str, float]
    new_best: bool
    warning: str | None  # one line per finding


class HeldoutWatch:
    """The RL trainer's view of its held-out curve: the training score of each interval, the alarm, the best
    evaluation. `metric` ranks evaluations (higher is better); `alarm` None: no alarm."""

    def __init__(self, metric: str, alarm: RegressionAlarm | None):
        self.metric = metric
        self.alarm = alarm
        self.train = IntervalMean()
        self.best = BestHeldout()

    def after_step(self, train_score: float) -> None:
        self.train.add(train_score)

    def evaluated(self, step: int, metrics: dict[str, float]) -> Verdict:
        """Feed an evaluation's metrics; `<metric>/regressed`, `<metric>/below_start`, after training began
        `val-aux/<source>/answers/collapsed`, and `val-aux/<source>/response_length/cut` (1/0) are logged when the
        alarm is on."""
        if self.metric not in metrics:
            core = sorted(k for k in metrics if k.startswith("val-core/"))
            raise ValueError(
                f"RLTrainer.heldout_metric {self.metric!r} is not among the evaluator's metrics (val-core: "
                f"{', '.join(core) or 'none'}); name one of them."
            )
        score = float(metrics[self.metric])
        train = self.train.take()
        found = collapses(step, metrics, self.alarm.collapse) \
            if self.alarm is not None and self.alarm.collapse is not None and train is not None else {}
        # a collapsed evaluation's score is the common answer's share, not the task learnt: never best/
        new_best = not any(found.values()) and self.best.update(step, score)
        if self.alarm is None:
            return Verdict({}, new_best, None)
        regression = self.alarm.update(self.metric, Evaluation(step, train, score))
        below = self.alarm.below_start(self.metric)
        logged = {f"{self.metric}/regressed": float(regression is not None)}
        if self.alarm.margin is not None:
            logged[f"{self.metric}/below_start"] = float(below is not None)
        logged.update({f"{SPREAD_PREFIX}{source}/answers/collapsed": float(c is not None) for source, c in found.items()})
        cuts = budget_cuts(step, metrics, self.alarm.cut) if self.alarm.cut is not None else {}
        logged.update({f"{SPREAD_PREFIX}{source}/response_length/cut": float(c is not None) for source, c in cuts.items()})
        warnings = [finding.warning() for finding in (regression, below, *found.values(), *cuts.values())
                    if finding is not None]
        return Verdict(logged, new_best, "\n".join(warnings) or None)

    def result(self) -> dict:
        """The best evaluation, for the stage's result (empty before any evaluation)."""
        if self.best.step is None:
            return {}
        return {"best": {"step": self.best.step, "metric": self.metric, "score": self.best.score}}

    def state_dict(self) -> dict:
        """The alarm's curve and the open interval, for a checkpoint (so a resumed run computes the same training
        score). The best evaluation is kept beside `best/`, which may be newer than the checkpoint."""
        return {"alarm": self.alarm.state_dict() if self.alarm is not None else None,
                "interval": [self.train.total, self.train.count]}

    def load_state_dict(self, state: dict) -> None:
        self.train.total, self.train.count = state.get("interval", [0.0, 0])
        if self.alarm is not None and state.get("alarm"):
            self.alarm.load_state_dict(state["alarm"])
