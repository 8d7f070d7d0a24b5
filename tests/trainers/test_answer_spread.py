"""rlhf.trainers.answer_spread: what counts as one answer, and how spread out the answers are (tables, pure)."""

import pytest

from rlhf.trainers.answer_spread import answer_key, answer_spread
from rlhf.trainers.evaluate import spread_metrics


@pytest.mark.parametrize(
    "response, key",
    [
        ("gcd(12, 18): 6. The answer is 6.", "6"),  # the asked-for form, full stop dropped
        ("The answer is **Six**.", "six"),  # case and markdown bold aside
        ("Answer: 42", "42"),
        ("We get \\boxed{7}", "7"),
        ("Let me think.\n12 * 3 = 36\n\n  36  ", "36"),  # no form: the last non-empty line
        ("Let me think.\nIt is   36 .", "it is 36"),  # spaces collapsed, closing full stop dropped
        ("", ""),
    ],
)
def test_what_counts_as_one_answer(response, key):
    assert answer_key(response) == key


@pytest.mark.parametrize(
    "responses, truths, expected",
    [
        # a guesser: "6" to three questions of four, whose right answers all differ
        (["The answer is 6.", "The answer is 6.", "the answer is 6", "The answer is 4."], ["2", "3", "6", "4"],
         {"top_share": 0.75, "distinct": 0.5, "truth_top_share": 0.25}),
        # every answer differs; two rows share a right answer; a row without one is left out of the truths
        (["The answer is 1.", "The answer is 2.", "The answer is 3."], ["1", "1", None],
         {"top_share": 1 / 3, "distinct": 1.0, "truth_top_share": 1.0}),
        # no truths given: the answers' figures only
        (["x", "y"], [], {"top_share": 0.5, "distinct": 1.0}),
        ([], ["1"], {}),
    ],
)
def test_spread_of_answers(responses, truths, expected):
    assert answer_spread(responses, truths) == pytest.approx(expected)


def test_the_evaluator_reports_the_spread_per_source_over_every_sample():
    rows = [{"data_source": "a", "responses": ["The answer is 1.", "The answer is 1."], "truth": "1"},
            {"data_source": "a", "responses": ["The answer is 1.", "The answer is 2."], "truth": "2"},
            {"data_source": "b", "responses": ["z", "z"], "truth": None}]
    assert spread_metrics(rows) == pytest.approx({
        "val-aux/a/answers/top_share": 0.75, "val-aux/a/answers/distinct": 0.5, "val-aux/a/answers/truth_top_share": 0.5,
        "val-aux/b/answers/top_share": 1.0, "val-aux/b/answers/distinct": 0.5,
    })
