"""math_score: last \\boxed{} answer, normalised, compared as strings or exact numbers."""

import pytest

from rlhf.rewards import is_equivalent, last_boxed, math_score
from rlhf.rewards.math import normalize

# (response, ground truth, expected score)
CASES = [
    (r"The answer is $\boxed{5}$.", "5", 1.0),
    (r"\boxed{5}", "6", 0.0),
    (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}", 1.0),
    (r"\boxed{\dfrac{1}{2}}", r"\frac{1}{2}", 1.0),
    (r"\boxed{\tfrac{1}{2}}", r"\frac12", 1.0),
    (r"\boxed{\frac12}", r"\frac{1}{2}", 1.0),
    (r"\boxed{0.5}", r"\frac{1}{2}", 1.0),
    (r"\boxed{1/2}", r"\frac{1}{2}", 1.0),
    (r"\boxed{.5}", r"\frac{1}{2}", 1.0),
    (r"\boxed{0.50}", r"\frac12", 1.0),
    (r"\boxed{\frac{2}{4}}", r"\frac{1}{2}", 1.0),  # same value
    (r"\boxed{-\frac{3}{4}}", "-0.75", 1.0),
    (r"\boxed{\frac{-3}{4}}", r"-\frac{3}{4}", 1.0),
    (r"\boxed{0.33}", r"\frac{1}{3}", 0.0),  # close is not equal
    (r"\boxed{\frac{3}{4}}", r"\frac{4}{3}", 0.0),
    (r"\boxed{ 12 }", "12", 1.0),
    (r"\boxed{1{,}000}", "1000", 1.0),  # LaTeX's braced thousands comma
    (r"\boxed{1,000}", "1000", 1.0),
    (r"\boxed{10\text{ cm}}", "10", 1.0),  # units
    (r"\boxed{10 \text{ inches}}", "10", 1.0),
    (r"\boxed{\text{Devon}}", r"\text{Devon}", 1.0),
    (r"\boxed{\text{(C)}}", "(C)", 1.0),
    (r"\boxed{30^\circ}", "30", 1.0),  # degrees
    (r"\boxed{30^{\circ}}", "30", 1.0),
    (r"\boxed{50\%}", "50", 1.0),  # percent
    (r"\boxed{\$18.90}", "18.90", 1.0),  # dollars
    (r"\boxed{18.9}", r"\$18.90", 1.0),
    (r"\boxed{5.}", "5", 1.0),  # trailing period
    (r"\boxed{\left( 3, \frac{\pi}{2} \right)}", r"\left( 3, \frac{\pi}{2} \right)", 1.0),
    (r"\boxed{(3,\frac{\pi}{2})}", r"\left( 3, \frac{\pi}{2} \right)", 1.0),
    (r"\boxed{\sqrt3}", r"\sqrt{3}", 1.0),
    (r"\boxed{2\sqrt{3}}", r"2 \sqrt{3}", 1.0),
    (r"\boxed{x = 5}", "5", 1.0),  # a short variable name before "=" is dropped
    (r"\boxed{k=-2}", "-2", 1.0),
    (r"\boxed{y = 2x + 3}", "2x+3", 1.0),
    (r"\boxed{[1, 4)}", "[1,4)", 1.0),
    (r"\boxed{(1, 4)}", "[1,4)", 0.0),  # open vs half-open interval
    (r"\boxed{\{1, 2\}}", r"\{1,2\}", 1.0),
    (r"\boxed{x^2 + 1}", "x^2+1", 1.0),
    (r"\boxed{\frac{\sqrt{3}}{2}}", r"\frac{\sqrt3}{2}", 1.0),
    (r"\boxed{3}\boxed{4}", "4", 1.0),  # the last box counts
    (r"First \boxed{4}, no wait, \boxed{3}", "4", 0.0),
    (r"\fbox{7}", "7", 1.0),
    (r"so the answer is \boxed 7$.", "7", 1.0),
    (r"The answer is 5", "5", 0.0),  # no box
    (r"\boxed{5", "5", 0.0),  # cut off inside the box
    (r"\boxed{}", "5", 0.0),
    (r"\boxed{\frac{1}{0}}", "0", 0.0),
    (r"\boxed{6}", r"Since ... the answer is $\boxed{6}$.", 1.0),  # full solution as reference
]


@pytest.mark.parametrize("response, truth, expected", CASES)
def test_math_table(response, truth, expected):
    assert math_score(response, truth) == expected


@pytest.mark.parametrize(
    "text, boxed",
    [
        (r"\boxed{a{b}c}", "a{b}c"),
        (r"\boxed{\frac{1}{2}} and more", r"\frac{1}{2}"),
        (r"x \boxed{1} y \boxed{\{2\}}", r"\{2\}"),
        (r"no box", None),
        (r"\boxed{open", None),
        (r"\boxed", None),
    ],
)
def test_last_boxed(text, boxed):
    assert last_boxed(text) == boxed


def test_normalize_examples():
    assert normalize(r"\dfrac{3}{4}") == r"\frac{3}{4}"
    assert normalize(r"3/4") == r"\frac{3}{4}"
    assert normalize(r"\left[ 1, 2 \right]") == "[1,2]"
    assert normalize("0.5") == r"\frac{1}{2}"


def test_is_equivalent_is_symmetric_on_the_table():
    for response, truth, expected in CASES:
        answer = last_boxed(response)
        if answer is not None and "\\boxed" not in truth:
            assert is_equivalent(truth, answer) == is_equivalent(answer, truth)


def test_unbalanced_reference_is_a_clear_error():
    with pytest.raises(ValueError, match="unbalanced"):
        math_score(r"\boxed{1}", r"\boxed{1")
