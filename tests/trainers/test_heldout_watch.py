"""rlhf.trainers.heldout_watch: when the alarm for a gamed reward fires, which evaluation is best (pure)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhf.trainers.heldout_watch import (
    BelowStart,
    BestHeldout,
    Evaluation,
    HeldoutWatch,
    IntervalMean,
    RegressionAlarm,
    regressed,
)

METRIC = "val-core/arithmetic/reward/mean@1"


def feed(points, k=2):
    """The alarm's answer after each (step, train, heldout) point."""
    alarm = RegressionAlarm(evaluations=k)
    return [alarm.update(METRIC, Evaluation(*p)) for p in points]


@pytest.mark.parametrize(
    "points, k, fires",
    [
        # held-out 0.42 -> 0.31 -> 0.25 while training rose 0.30 -> 0.41 -> 0.52: two falls in a row
        ([(10, 0.30, 0.42), (20, 0.41, 0.31), (30, 0.52, 0.25)], 2, [False, False, True]),
        # one fall is not enough at K=2, but is at K=1
        ([(10, 0.30, 0.42), (20, 0.41, 0.31)], 2, [False, False]),
        ([(10, 0.30, 0.42), (20, 0.41, 0.31)], 1, [False, True]),
        # the training score fell too: the policy got worse at both, not a gamed reward
        ([(10, 0.30, 0.42), (20, 0.25, 0.31), (30, 0.20, 0.25)], 2, [False, False, False]),
        # held-out level (not lower) breaks the run
        ([(10, 0.30, 0.42), (20, 0.41, 0.31), (30, 0.52, 0.31), (40, 0.60, 0.20)], 2, [False] * 4),
        # before training (no training score) cannot start a run; two regressed intervals after it do
        ([(0, None, 0.50), (10, 0.30, 0.42), (20, 0.41, 0.31), (30, 0.52, 0.25)], 2, [False, False, False, True]),
        # it keeps warning while the run goes on, and stops when the held-out score recovers
        ([(1, 0.1, 0.9), (2, 0.2, 0.8), (3, 0.3, 0.7), (4, 0.4, 0.6), (5, 0.5, 0.65)], 2,
         [False, False, True, True, False]),
    ],
)
def test_when_the_alarm_fires(points, k, fires):
    assert [r is not None for r in feed(points, k)] == fires


def test_the_warning_names_both_curves_and_the_steps():
    regression = feed([(10, 0.30, 0.42), (20, 0.41, 0.31), (30, 0.52, 0.25)])[-1]
    assert regression.warning() == (
        "warning: held-out val-core/arithmetic/reward/mean@1 fell 0.42 -> 0.31 -> 0.25 over steps 10-30 while the "
        "training score (critic/score/mean between evaluations) rose 0.3 -> 0.41 -> 0.52: the reward may be gamed "
        "(docs/debugging.md#the-held-out-score-falls-while-the-training-score-rises)"
    )
    assert "\n" not in regression.warning()


scores = st.floats(0, 1, allow_nan=False)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(scores, scores), min_size=1, max_size=12), st.integers(1, 4))
def test_fires_exactly_when_the_last_k_evaluations_all_regressed(curve, k):
    """Against the rule written out: at evaluation i, each of the K pairs (j-1, j) ending at i regressed."""
    points = [Evaluation(step, train, held) for step, (train, held) in enumerate(curve)]
    answers = feed([(p.step, p.train, p.heldout) for p in points], k)
    for i, answer in enumerate(answers):
        expected = i >= k and all(
            points[j].heldout < points[j - 1].heldout and points[j].train > points[j - 1].train
            for j in range(i - k + 1, i + 1)
        )
        assert (answer is not None) == expected
        if answer is not None:
            assert answer.evaluations == tuple(points[i - k: i + 1])


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(scores, scores), min_size=1, max_size=12))
def test_a_held_out_score_that_never_falls_never_fires(curve):
    helds = sorted(h for _, h in curve)  # non-decreasing held-out curve, any training curve
    assert all(r is None for r in feed([(i, t, h) for i, ((t, _), h) in enumerate(zip(curve, helds))], k=1))


def test_regressed_needs_both_training_scores():
    assert not regressed(Evaluation(0, None, 0.9), Evaluation(1, 0.5, 0.1))
    assert regressed(Evaluation(0, 0.1, 0.9), Evaluation(1, 0.5, 0.1))


def test_k_must_be_positive():
    with pytest.raises(ValueError, match="evaluations must be >= 1"):
        RegressionAlarm(evaluations=0)


def test_the_training_score_is_the_interval_mean():
    interval = IntervalMean()
    assert interval.take() is None  # no step before the first evaluation
    for score in (0.1, 0.2, 0.6):
        interval.add(score)
    assert interval.take() == pytest.approx(0.3)  # (0.1 + 0.2 + 0.6) / 3
    assert interval.take() is None  # a new interval


def test_one_noisy_step_does_not_fire_the_alarm():
    """The last step before the second evaluation jumps above the first interval's score, but the interval's
    mean fell: the training score did not rise, so no alarm (K=1; the below-start rule off)."""
    watch = HeldoutWatch(METRIC, RegressionAlarm(evaluations=1, margin=None))
    for step, interval in enumerate([[0.5, 0.5, 0.5, 0.5], [0.3, 0.3, 0.3, 0.6]], start=1):
        for score in interval:
            watch.after_step(score)
        verdict = watch.evaluated(step * 4, {METRIC: 0.6 - 0.1 * step})  # held-out 0.5 -> 0.4
    # last step 0.6 > 0.5, interval mean (0.3 * 3 + 0.6) / 4 = 0.375 < 0.5
    assert verdict.warning is None and verdict.metrics == {f"{METRIC}/regressed": 0.0}


def test_the_best_evaluation_is_the_highest_and_the_earliest_of_ties():
    best = BestHeldout()
    assert [best.update(s, v) for s, v in [(0, 0.2), (10, 0.5), (20, 0.5), (30, 0.4)]] == [True, True, False, False]
    assert (best.step, best.score) == (10, 0.5)


def test_watch_reports_best_and_regressed_and_names_a_missing_metric():
    watch = HeldoutWatch(METRIC, RegressionAlarm())
    assert watch.result() == {}
    verdict = watch.evaluated(0, {METRIC: 0.4})
    assert verdict.new_best and verdict.metrics == {f"{METRIC}/regressed": 0.0, f"{METRIC}/below_start": 0.0}
    assert watch.result() == {"best": {"step": 0, "metric": METRIC, "score": 0.4}}
    with pytest.raises(ValueError, match=r"heldout_metric .*\(val-core: val-core/other"):
        watch.evaluated(1, {"val-core/other/reward/mean@1": 0.1})
    assert HeldoutWatch(METRIC, None).evaluated(0, {METRIC: 0.1}).metrics == {}  # alarm off: nothing logged


def test_state_round_trips():
    """Resumed from a checkpoint taken mid-interval, the run of regressed evaluations and the interval's
    steps carry over: the same answer as without the resume."""
    watch = HeldoutWatch(METRIC, RegressionAlarm())
    for step, (train, held) in enumerate([(0.1, 0.9), (0.2, 0.8)], start=1):
        watch.after_step(train)
        watch.evaluated(step, {METRIC: held})
    watch.after_step(0.5)  # interval 3: 0.5 then 0.1, mean 0.3 > 0.2; 0.1 alone would not have risen
    resumed = HeldoutWatch(METRIC, RegressionAlarm())
    resumed.load_state_dict(watch.state_dict())
    resumed.after_step(0.1)
    verdict = resumed.evaluated(3, {METRIC: 0.7})
    assert verdict.warning is not None and "rose 0.1 -> 0.2 -> 0.3" in verdict.warning


def below(points, k=2, margin=0.05):
    """The below-start rule's answer after each (step, train, heldout) point."""
    alarm = RegressionAlarm(evaluations=k, margin=margin)
    answers = []
    for p in points:
        alarm.update(METRIC, Evaluation(*p))
        answers.append(alarm.below_start(METRIC))
    return answers


@pytest.mark.parametrize(
    "points, k, fires",
    [
        # gcd, seed 1 of the transfer panel (its recorded validations and interval training scores): 0.305 before
        # training, 0.15 and 0.16 after (one fall, then flat),
        # while the training score stayed up: the regression rule never fires, this one does
        ([(0, None, 0.305), (5, 0.186, 0.15), (10, 0.227, 0.16)], 2, [False, False, True]),
        # a dip while a format is learnt, then recovery: one evaluation below the start is not K=2
        ([(0, None, 0.30), (5, 0.1, 0.10), (10, 0.3, 0.45)], 2, [False, False, False]),
        # within the margin: noise, not a fall
        ([(0, None, 0.30), (5, 0.2, 0.26), (10, 0.3, 0.26)], 2, [False, False, False]),
        # K=1 fires at the first evaluation below the start, and keeps firing while it stays there
        ([(0, None, 0.30), (5, 0.2, 0.20), (10, 0.3, 0.20), (15, 0.3, 0.40)], 1, [False, True, True, False]),
        # evaluations without a training score (before training) never count as below the start
        ([(0, None, 0.30), (0, None, 0.10), (5, 0.2, 0.10)], 2, [False, False, False]),
    ],
)
def test_when_the_below_start_rule_fires(points, k, fires):
    assert [r is not None for r in below(points, k)] == fires


def test_the_below_start_warning_names_the_start_the_fall_and_where_to_look():
    finding = below([(0, None, 0.305), (5, 0.186, 0.15), (10, 0.227, 0.16)])[-1]
    assert finding == BelowStart(METRIC, Evaluation(0, None, 0.305),
                                 (Evaluation(5, 0.186, 0.15), Evaluation(10, 0.227, 0.16)), 0.05)
    warning = finding.warning()
    assert warning.startswith(f"warning: held-out {METRIC} is 0.15 -> 0.16 at steps 5-10, more than 0.05 below its "
                              "0.305 at step 0, while the training score (critic/score/mean between evaluations) "
                              "is 0.186 -> 0.227")
    assert "answers/top_share" in warning and "docs/debugging.md#the-held-out-score-stays-below-its-start" in warning
    assert "\n" not in warning


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(scores, scores), min_size=1, max_size=10), st.integers(1, 3), st.floats(0, 0.5))
def test_below_start_fires_exactly_by_its_rule(curve, k, margin):
    """Against the rule written out; the first point has no training score (validation before training)."""
    points = [(0, None, curve[0][1])] + [(i, t, h) for i, (t, h) in enumerate(curve[1:], start=1)]
    for i, answer in enumerate(below(points, k, margin)):
        expected = i >= k and all(points[j][2] < points[0][2] - margin for j in range(i - k + 1, i + 1))
        assert (answer is not None) == expected


def test_the_watch_warns_for_both_rules_on_their_own_lines_and_logs_both():
    watch = HeldoutWatch(METRIC, RegressionAlarm(evaluations=1))
    watch.evaluated(0, {METRIC: 0.5})
    watch.after_step(0.2)
    watch.evaluated(1, {METRIC: 0.45})
    watch.after_step(0.4)
    verdict = watch.evaluated(2, {METRIC: 0.3})  # fell while training rose, and 0.2 below the start
    assert verdict.metrics == {f"{METRIC}/regressed": 1.0, f"{METRIC}/below_start": 1.0}
    lines = verdict.warning.split("\n")
    assert len(lines) == 2 and "fell 0.45 -> 0.3" in lines[0] and "is 0.3 at step 2" in lines[1]


def test_margin_must_not_be_negative():
    for bad in (-0.1, float("nan")):
        with pytest.raises(ValueError, match=r"margin must be >= 0"):
            RegressionAlarm(margin=bad)
    assert RegressionAlarm(margin=None).below_start(METRIC) is None


SPREAD = "val-aux/reasoning_gym/letter_counting/answers/"


@pytest.mark.parametrize("top,truth,collapsed", [
    (1.0, 0.6, True),    # one answer to every question, whose right answers agree 60% of the time
    (0.9, 0.6, True),    # at the threshold
    (0.89, 0.6, False),  # below it
    (0.95, 0.9, False),  # the right answers are themselves nearly all one: answering it is not a collapse
    (0.95, 0.95, False),
])
def test_one_answer_to_every_question_is_a_collapse_after_training_began(top, truth, collapsed):
    watch = HeldoutWatch(METRIC, RegressionAlarm())
    before = watch.evaluated(0, {METRIC: 0.5, SPREAD + "top_share": top, SPREAD + "truth_top_share": truth})
    assert SPREAD + "collapsed" not in before.metrics and before.warning is None  # before training: the base model's
    watch.after_step(0.5)
    verdict = watch.evaluated(5, {METRIC: 0.6, SPREAD + "top_share": top, SPREAD + "truth_top_share": truth})
    assert verdict.metrics[SPREAD + "collapsed"] == float(collapsed)
    if collapsed:
        assert verdict.warning == (
            f"warning: at step 5 the policy gives one answer to {top:.0%} of the held-out "
            f"reasoning_gym/letter_counting questions ({SPREAD}top_share), whose right answers agree only "
            f"{truth:.0%} of the time (truth_top_share): it has learnt the most common answer, not the task, and "
            f"its held-out score cannot pass {truth:.0%} that way; this evaluation is not kept as best/ "
            f"(docs/debugging.md#every-question-gets-the-same-answer)")
    else:
        assert verdict.warning is None


def test_a_collapsed_evaluation_is_never_best_however_high_its_score():
    def spread(top):
        return {SPREAD + "top_share": top, SPREAD + "truth_top_share": 0.6}

    watch = HeldoutWatch(METRIC, RegressionAlarm())
    assert watch.evaluated(0, {METRIC: 0.5, **spread(1.0)}).new_best  # before training: the base model, whatever
    watch.after_step(0.5)
    assert not watch.evaluated(4, {METRIC: 0.6, **spread(1.0)}).new_best  # above the base, but one answer to all
    assert watch.result()["best"] == {"step": 0, "metric": METRIC, "score": 0.5}
    watch.after_step(0.6)
    assert not watch.evaluated(8, {METRIC: 0.55, **spread(0.95)}).new_best
    watch.after_step(0.6)
    assert watch.evaluated(12, {METRIC: 0.52, **spread(0.4)}).new_best  # spread out again and above the base
    assert watch.result()["best"] == {"step": 12, "metric": METRIC, "score": 0.52}
    # with the collapse rule off (or no alarm) the score alone decides, as before
    for alarm in (RegressionAlarm(collapse=None), None):
        plain = HeldoutWatch(METRIC, alarm)
        plain.evaluated(0, {METRIC: 0.5})
        plain.after_step(0.5)
        assert plain.evaluated(4, {METRIC: 0.6, **spread(1.0)}).new_best


def test_the_collapse_rule_can_be_set_or_turned_off():
    metrics = {METRIC: 0.6, SPREAD + "top_share": 0.8, SPREAD + "truth_top_share": 0.6}
    for alarm, expected in [(RegressionAlarm(collapse=0.75), 1.0), (RegressionAlarm(), 0.0),
                            (RegressionAlarm(collapse=None), None)]:
        watch = HeldoutWatch(METRIC, alarm)
        watch.after_step(0.5)
        assert watch.evaluated(1, metrics).metrics.get(SPREAD + "collapsed") == expected
    for bad in (0, 1.5, float("nan")):
        with pytest.raises(ValueError, match=r"collapse must be in \(0, 1\]"):
            RegressionAlarm(collapse=bad)


CLIP = "val-aux/reasoning_gym/word_sorting/response_length/"


@pytest.mark.parametrize("ratio,cut", [(0.0, False), (0.09, False), (0.1, True), (0.35, True), (1.0, True)])
def test_answers_at_the_response_budget_warn_before_training_too(ratio, cut):
    """The share of held-out responses that reached the budget, at the evaluation before training (the base model's
    answers, when the budget is cheapest to fix) and after: at 10% or more it warns, naming the share and the fix."""
    watch = HeldoutWatch(METRIC, RegressionAlarm())
    for step in (0, 5):
        verdict = watch.evaluated(step, {METRIC: 0.5, CLIP + "clip_ratio": ratio})
        assert verdict.metrics[CLIP + "cut"] == float(cut)
        if cut:
            assert verdict.warning == (
                f"warning: at step {step} {ratio:.0%} of the held-out reasoning_gym/word_sorting responses reached "
                f"the response budget ({CLIP}clip_ratio): an answer cut there loses its final line, so right answers "
                "score nothing; measure the model's answer lengths with `rlhf probe` and raise max_new_tokens "
                "(docs/debugging.md#answers-reach-the-response-budget)")
        else:
            assert verdict.warning is None
        watch.after_step(0.5)


def test_the_budget_rule_can_be_set_or_turned_off_and_joins_the_other_warnings():
    metrics = {METRIC: 0.6, CLIP + "clip_ratio": 0.3, SPREAD + "top_share": 1.0, SPREAD + "truth_top_share": 0.6}
    for alarm, expected in [(RegressionAlarm(cut=0.5), 0.0), (RegressionAlarm(), 1.0), (RegressionAlarm(cut=None), None)]:
        watch = HeldoutWatch(METRIC, alarm)
        watch.after_step(0.5)
        verdict = watch.evaluated(1, metrics)
        assert verdict.metrics.get(CLIP + "cut") == expected
        assert verdict.warning.count("\n") == (1 if expected else 0)  # the collapse's line, and the budget's
    for bad in (0, 1.5, float("nan")):
        with pytest.raises(ValueError, match=r"cut must be in \(0, 1\]"):
            RegressionAlarm(cut=bad)
