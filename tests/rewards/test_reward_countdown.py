"""countdown_score: correct -> 1, well-formed but wrong -> 0.1, malformed -> 0; never eval."""

import json
import time

import pytest

from rlhf.rewards import countdown_score

GT = json.dumps({"target": 24, "numbers": [2, 3, 4]})
GT4 = json.dumps({"target": 10, "numbers": [1, 2, 3, 4]})
GT_DUP = json.dumps({"target": 10, "numbers": [5, 5, 2]})


def a(equation: str) -> str:
    return f"<think>Let me try.</think>\n<answer>{equation}</answer>"


CASES = [
    # correct: each number once, value equals target
    (a("2 * 3 * 4"), GT, 1.0),
    (a("(2 + 4) * 3 + 6 - 6"), GT, 0.1),  # uses numbers not given
    (a("4 * 3 * 2"), GT, 1.0),
    (a("(3 * 4) * 2"), GT, 1.0),
    (a("  2*3*4  "), GT, 1.0),  # spacing
    (a("2*(3*4)"), GT, 1.0),
    (a("4 / (1 - 3 / 4) * 2 * 3 / 4 / 2"), GT, 0.1),
    (a("(4 - 2) * 3 * 4"), GT, 0.1),  # 4 used twice
    (a("1 + 2 + 3 + 4"), GT4, 1.0),
    (a("4 * 3 - 2 * 1"), GT4, 1.0),
    (a("(4 + 1) * (3 - 2 + 1)"), GT4, 0.1),  # 1 used twice
    (a("5 + 5 / 5 * 2"), GT_DUP, 0.1),  # three 5s, no
    (a("5 * 2 + 5 - 5"), GT_DUP, 0.1),
    (a("(5 + 5) * 2 / 2"), GT_DUP, 0.1),
    (a("5 + 5 * 2 / 2"), GT_DUP, 0.1),
    (a("(5 + 5) / 2 * 2"), GT_DUP, 0.1),
    (a("5 * 2"), GT_DUP, 0.1),  # a 5 left unused
    (a("5 / 5 + 2"), GT_DUP, 0.1),  # = 3, wrong value
    (a("2 * 5 + 5 - 5"), GT_DUP, 0.1),
    (a("-2 + 3 * 4"), GT, 0.1),  # unary minus is allowed, value 10 is wrong
    (a("2 / (3 - 3) * 4"), GT, 0.1),  # 3 twice
    (a("3 / (4 - 2 * 2)"), GT, 0.1),
    (a("4 / (3 - 3)"), json.dumps({"target": 1, "numbers": [4, 3, 3]}), 0.1),  # division by zero
    (a("7 / 3 * 3"), json.dumps({"target": 7, "numbers": [7, 3, 3]}), 1.0),  # exact fractions
    (a("1 / 3 + 1 / 3 + 1 / 3"), json.dumps({"target": 1, "numbers": [1, 3, 1, 3, 1, 3]}), 1.0),
    # wrong value with the right numbers
    (a("2 + 3 + 4"), GT, 0.1),
    (a("2 * 3 + 4"), GT, 0.1),
    # the last <answer> counts
    (a("2 + 3 + 4") + a("2 * 3 * 4"), GT, 1.0),
    (a("2 * 3 * 4") + a("2 + 3 + 4"), GT, 0.1),
    ("example <answer> (1 + 2) / 3 </answer> ... <answer>2*3*4</answer>", GT, 1.0),
    # malformed: 0
    ("2 * 3 * 4", GT, 0.0),  # no tags
    ("<answer>2 * 3 * 4", GT, 0.0),  # unclosed
    (a(""), GT, 0.0),
    (a("2 * 3 * 4 = 24"), GT, 0.0),  # "=" is not an expression
    (a("2 × 3 × 4"), GT, 0.0),  # unicode times
    (a("2 ** 3 * 4"), GT, 0.0),  # power is not allowed
    (a("(2 + 3) // 4"), GT, 0.0),  # floor division is not allowed
    (a("2(3)(4)"), GT, 0.0),  # implicit multiplication parses as a call
    (a("2.0 * 3 * 4"), GT, 0.0),  # only integer literals
    (a("02 * 3 * 4"), GT, 0.0),  # leading zeros are a syntax error
    (a("__import__('os').system('echo hacked')"), GT, 0.0),
    (a("(2 * 3 * 4"), GT, 0.0),
    (a("twenty four"), GT, 0.0),
    (a("2 * 3 * 4; 1"), GT, 0.0),
    (a("1_0 + 2"), GT, 0.0),
]


@pytest.mark.parametrize("response, truth, expected", CASES)
def test_countdown_table(response, truth, expected):
    assert countdown_score(response, truth) == expected


def test_multiline_answer_and_dict_ground_truth():
    response = "<answer>\n(2 * 3)\n * 4\n</answer>"
    assert countdown_score(response, {"target": 24, "numbers": [2, 3, 4]}) == 1.0


def test_scores_are_options():
    assert countdown_score(a("2 + 3 + 4"), GT, format_score=0.0) == 0.0
    assert countdown_score(a("2 * 3 * 4"), GT, score=2.0) == 2.0


@pytest.mark.parametrize(
    "equation",
    [
        "-" * 190 + "2",  # long unary chain
        "(" * 99 + "2" + ")" * 99,  # deep nesting within the length limit
        "(" * 150 + "2" + ")" * 150,  # over the limit
        "9" * 199,  # a huge literal
        "99999999*" * 22 + "9",  # a huge product
        "2 * 3 * 4" + " + 0" * 10_000,  # very long string
        "1/" * 99 + "0",
    ],
)
def test_hostile_equations_are_safe_and_fast(equation):
    start = time.perf_counter()
    assert countdown_score(a(equation), GT) in (0.0, 0.1)
    assert time.perf_counter() - start < 0.5


def test_bad_ground_truth_says_what_is_expected():
    with pytest.raises(ValueError, match=r'not \{"target": T, "numbers": \[...\]\}'):
        countdown_score(a("1"), "24")
