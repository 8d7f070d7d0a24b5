"""The probe's numbers: accuracies (strict, lenient where reported), length statistics, budget cuts, advice."""

import pytest

from rlhf.trainers.probe import budget_cuts, format_report, length_stats, probe_report, recommendation, samples_report

# ten responses' lengths in tokens (EOS included), sorted for reading: 4 5 6 8 9 10 12 30 40 64
LENGTHS = [30, 4, 10, 64, 5, 12, 8, 6, 40, 9]


def _rows(lengths, source="s"):
    return [{"data_source": source, "response_lengths": [n], "responses": ["x"]} for n in lengths]


def test_length_stats_are_numpys():
    # median of the sorted ten: (9 + 10) / 2; p90 (linear): rank 0.9 * 9 = 8.1 -> 40 + 0.1 * (64 - 40) = 42.4
    assert length_stats(LENGTHS) == {"median": 9.5, "p90": pytest.approx(42.4), "max": 64, "mean": 18.8}


def test_budget_cuts_count_responses_longer_than_the_budget():
    cuts = budget_cuts(LENGTHS, [64, 8, 16, 32], max_new_tokens=128)
    # above 8: 30 10 64 12 40 9 = 6; above 16: 30 64 40 = 3; above 32: 64 40 = 2; above 64: none
    assert cuts == [{"budget": 8, "cut": 0.6, "lower_bound": False}, {"budget": 16, "cut": 0.3, "lower_bound": False},
                    {"budget": 32, "cut": 0.2, "lower_bound": False}, {"budget": 64, "cut": 0.0, "lower_bound": False}]
    # the probe's own limit was 64 and one response reached it: a budget of 64 or more is only a lower bound
    assert [c["lower_bound"] for c in budget_cuts(LENGTHS, [32, 64, 128], max_new_tokens=64)] == [False, True, True]


def test_the_recommendation_is_the_smallest_budget_within_max_cut():
    cuts = budget_cuts(LENGTHS, [8, 16, 32, 64], max_new_tokens=128)
    assert recommendation(cuts, 0.05, 128)[0] == 64
    assert recommendation(cuts, 0.2, 128) == (32, "max_new_tokens=32: the smallest budget that cuts <= 20% of the "
                                                   "responses (20.0%)")
    at_limit = budget_cuts(LENGTHS, [8, 64], max_new_tokens=64)  # 64 cuts 0 known, but 64 itself was reached
    budget, line = recommendation(at_limit, 0.05, 64)
    assert budget is None and "no budget in [8, 64]" in line and "--max-new-tokens above them; now 64" in line


def test_report_strict_and_lenient_accuracy_with_and_without_extras():
    rows = _rows(LENGTHS[:4], "a") + _rows(LENGTHS[4:], "b")
    scores = [1.0, 0.0, 0.0, 0.5, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    extras = {"lenient": [1.0, 1.0, 0.0, 1.0, 1.0, 1.0, None, 0.0, 0.0, 0.0],  # None: that scorer reports none
              "format": [1.0, 0.0, 1.0, 1.0, 1.0, 0.0, None, 1.0, 0.0, 0.0]}
    report = probe_report(rows, scores, extras, budgets=[16, 64], max_new_tokens=128)
    assert report["strict_accuracy"] == 0.2  # 0.5 is not right
    assert report["lenient_accuracy"] == 0.5  # the row without a lenient score counts its strict 0
    assert report["format_rate"] == 5 / 9 and report["lenient_reported"]
    assert report["by_source"] == {"a": {"rows": 4, "strict_accuracy": 0.25, "lenient_accuracy": 0.75},
                                   "b": {"rows": 6, "strict_accuracy": 1 / 6, "lenient_accuracy": 2 / 6}}
    assert report["length"] == length_stats(LENGTHS) and report["at_limit"] == 0.0
    assert report["recommended_budget"] == 64
    plain = probe_report(rows, scores, {}, budgets=[16], max_new_tokens=64)
    assert plain["lenient_accuracy"] == plain["strict_accuracy"] == 0.2 and not plain["lenient_reported"]
    assert plain["format_rate"] is None and plain["at_limit"] == 0.1
    text = format_report(plain)
    assert "strict 20.0%, lenient 20.0% (the scorer reports no lenient score: strict)" in text
    assert "median 9.5, p90 42.4, max 64 (10.0% reached max_new_tokens)" in text


def test_samples_report_counts_what_grpo_could_learn_from():
    scores = [[1.0, 0.0, 0.0, 0.0],   # right once: a signal, right and wrong
              [0.0, 0.0, 0.0, 0.0],   # never right: no signal
              [1.0, 1.0, 1.0, 1.0],   # always right: no signal
              [0.1, 0.0, 0.0, 0.0],   # a partial credit only: a signal, but never right
              [1.0, 1.0, 0.5, 0.0]]   # right twice
    report = samples_report(scores, temperature=0.7, max_new_tokens=64)
    assert report == {"k": 4, "temperature": 0.7, "max_new_tokens": 64, "rows": 5,
                      "accuracy": 7 / 20, "pass_at_k": 3 / 5, "signal_share": 3 / 5, "right_and_wrong": 2 / 5}
    lenient = [[1.0, 1.0, 1.0, 1.0], [1.0, 0.0, 0.0, 0.0], [1.0] * 4, [0.0] * 4, [1.0, 1.0, 0.0, 0.0]]
    loose = samples_report(scores, temperature=0.7, max_new_tokens=64, lenient=lenient)
    assert loose == {**report, "lenient_pass_at_k": 4 / 5, "lenient_right_and_wrong": 2 / 5}
    assert "format aside: pass@4 80.0%, 40.0% of rows both right and wrong" in format_report(
        {**probe_report(_rows(LENGTHS), [1.0] * 10, {}, budgets=[16], max_new_tokens=128), "samples": loose})
    with pytest.raises(ValueError, match="at least one sampled score"):
        samples_report([[1.0], []], temperature=0.7, max_new_tokens=8)


def test_the_printed_report_gives_the_sampled_numbers_and_the_groups_per_step():
    report = probe_report(_rows(LENGTHS), [1.0] * 10, {}, budgets=[16], max_new_tokens=128)
    assert "sampled" not in format_report(report)
    report["samples"] = samples_report([[1.0, 0.0]] * 3 + [[0.0, 0.0]], temperature=0.7, max_new_tokens=64)
    text = format_report(report)
    assert "sampled: 2 per row at temperature 0.7, max_new_tokens 64: accuracy 37.5%, pass@2 75.0%" in text
    assert "GRPO signal: 75.0% of rows have samples that score differently (75.0% both right and wrong); a step of " \
           "8 prompts has about 6.0 groups to learn from" in text
