"""gsm8k_score: a table of real-looking responses under strict and flexible extraction."""

import functools

import pytest

from rlhf.rewards import gsm8k_flexible, gsm8k_score, gsm8k_strict
from rlhf.rewards.gsm8k import extract_flexible, extract_strict

WORKED = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips.\n#### 72"

# (response, ground truth, strict score, flexible score) with verl's rewards: 1 correct,
# 0 wrong (format_score=0), 0 nothing parsed.
CASES = [
    (WORKED, "72", 1.0, 1.0),
    ("#### 72", "72", 1.0, 1.0),
    ("The answer is 72.\n#### 72", "72", 1.0, 1.0),
    ("####72", "72", 1.0, 1.0),  # no space after the marker
    ("#### 72.", "72", 1.0, 1.0),  # trailing period
    ("#### 72\n", "72", 1.0, 1.0),
    ("#### $72", "72", 1.0, 1.0),  # dollar sign
    ("#### \\$72", "72", 1.0, 1.0),  # LaTeX-escaped dollar
    ("#### **72**", "72", 1.0, 1.0),  # markdown bold
    ("#### 1,234", "1234", 1.0, 1.0),  # thousands comma
    ("#### $1,234.", "1234", 1.0, 1.0),  # all at once
    ("#### 12,345,678", "12345678", 1.0, 1.0),
    ("#### 1234", "1,234", 1.0, 1.0),  # raw GSM8K ground truth with a comma
    ("#### 72.0", "72", 1.0, 1.0),  # same number as a decimal
    ("#### 72.00", "72", 1.0, 1.0),
    ("#### 72.5", "72", 0.0, 0.0),
    ("#### -5", "-5", 1.0, 1.0),  # negative answer
    ("#### 5", "-5", 0.0, 0.0),
    ("#### 0.25", "0.25", 1.0, 1.0),
    ("#### 71", "72", 0.0, 0.0),  # wrong
    ("#### 72\n#### 71", "72", 0.0, 0.0),  # the LAST marker counts
    ("#### 71\nActually, #### 72", "72", 1.0, 1.0),
    ("#### 72\n#### (no number)", "72", 1.0, 1.0),  # last marker followed by a number (verl)
    ("The answer is 72.", "72", 0.0, 1.0),  # no marker: strict finds nothing
    ("She has 3 apples and 72 pears, so 72", "72", 0.0, 1.0),
    ("72 is the answer, I think 5 more", "72", 0.0, 0.0),  # flexible takes the last number
    ("The total is 1,234.", "1234", 0.0, 1.0),
    ("The answer is $1,234.50", "1234.5", 0.0, 1.0),
    ("10-3=7", "7", 0.0, 1.0),  # "-3" is subtraction, not a negative number
    ("It drops to -7", "-7", 0.0, 1.0),
    ("I don't know.", "72", 0.0, 0.0),  # nothing parsed
    ("", "72", 0.0, 0.0),
    ("#### seventy-two", "72", 0.0, 0.0),
    ("####", "72", 0.0, 0.0),
    ("Step 1: 2*3=6. Step 2: 6+4=10\n#### 10<|im_end|>", "10", 1.0, 1.0),
    ("#### 10 apples", "10", 1.0, 1.0),
    ("# 72", "72", 0.0, 1.0),  # a single "#" is not the marker
]


@pytest.mark.parametrize("response, truth, strict, flexible", CASES)
def test_gsm8k_table(response, truth, strict, flexible):
    assert gsm8k_score(response, truth) == strict
    assert gsm8k_strict(response, truth) == strict
    assert gsm8k_score(response, truth, method="flexible") == flexible
    assert gsm8k_flexible(response, truth) == flexible


def test_format_score_and_score_options():
    assert gsm8k_score("#### 71", "72", format_score=0.1, score=2.0) == 0.1
    assert gsm8k_score("#### 72", "72", format_score=0.1, score=2.0) == 2.0
    assert gsm8k_score("no number", "72", format_score=0.1) == 0.0  # nothing parsed: not even format
    bound = functools.partial(gsm8k_score, method="flexible", format_score=0.2)
    assert bound("so 71", "72") == 0.2


def test_extractors():
    assert extract_strict("#### 1,234.") == "1,234"
    assert extract_strict("no marker 5") is None
    assert extract_flexible("a 1 b 2,000 c.") == "2,000"
    assert extract_flexible("none") is None


def test_bad_method_and_bad_ground_truth():
    with pytest.raises(ValueError, match=r"method must be one of \['flexible', 'strict'\], got 'loose'"):
        gsm8k_score("#### 1", "1", method="loose")
    with pytest.raises(ValueError, match="ground truth 'seventy' is not a number"):
        gsm8k_score("#### 1", "seventy")


def test_long_response_is_fast():
    import time

    text = "1,2,3 " * 50_000 + "-" * 100_000 + "#### 42"
    start = time.perf_counter()
    assert gsm8k_score(text, "42") == 1.0
    assert gsm8k_score(text, "42", method="flexible") == 1.0
    assert time.perf_counter() - start < 1.0
