"""exact_match_score: only whitespace and trailing end-of-turn markers are forgiven."""

import pytest

from rlhf.rewards import exact_match_score

CASES = [
    ("68", "68", 1.0),
    (" 68", "68", 1.0),
    ("68 ", "68", 1.0),
    ("\n68\n", "68", 1.0),
    ("\t68\t\n", "68", 1.0),
    ("68<|im_end|>", "68", 1.0),
    ("68 <|im_end|>", "68", 1.0),
    ("68<|im_end|>\n", "68", 1.0),
    ("68<|endoftext|>", "68", 1.0),
    ("68<|im_end|><|endoftext|>", "68", 1.0),  # markers stack
    ("68</s>", "68", 1.0),
    ("68<|eot_id|>", "68", 1.0),
    ("68", " 68 ", 1.0),  # ground truth whitespace is ignored too
    ("100", "100", 1.0),
    ("198", "198", 1.0),
    ("69", "68", 0.0),
    ("86", "68", 0.0),
    ("6", "68", 0.0),
    ("688", "68", 0.0),
    ("068", "68", 0.0),  # leading zero is not the same answer
    ("68.", "68", 0.0),
    ("68.0", "68", 0.0),
    ("+68", "68", 0.0),
    ("6 8", "68", 0.0),
    ("The answer is 68", "68", 0.0),
    ("68 apples", "68", 0.0),
    ("What is 23+45? 68", "68", 0.0),
    ("<|im_end|>68", "68", 0.0),  # only trailing markers are removed
    ("68<|im_start|>", "68", 0.0),
    ("", "68", 0.0),
    ("<|im_end|>", "68", 0.0),
    ("   ", "68", 0.0),
    ("６８", "68", 0.0),  # full-width digits are other characters
]


@pytest.mark.parametrize("response, truth, expected", CASES)
def test_exact_match_table(response, truth, expected):
    assert exact_match_score(response, truth) == expected


def test_end_markers_option():
    assert exact_match_score("68[END]", "68", end_markers=("[END]",)) == 1.0
    assert exact_match_score("68<|im_end|>", "68", end_markers=()) == 0.0


def test_extra_info_is_accepted_and_ignored():
    assert exact_match_score("68", "68", {"split": "test"}) == 1.0


DIGIT_CASES = [
    ("114", "114", 1.0),
    ("114<|im_end|>", "114", 1.0),  # same clean-up as exact_match_score
    ("104", "114", 2 / 3),  # units and hundreds line up
    ("14", "114", 2 / 3),  # aligned from the right: 4 under 4, 1 under 1
    ("1140", "114", 1 / 4),  # 0|4, 4|1, 1|1, 1|-: one match over four places
    ("99", "35", 0.0),
    ("", "35", 0.0),
    ("5", "35", 0.5),
]


@pytest.mark.parametrize("response, truth, expected", DIGIT_CASES)
def test_digit_match_score(response, truth, expected):
    from rlhf.rewards import digit_match_score

    assert digit_match_score(response, truth) == pytest.approx(expected)


@pytest.mark.parametrize("response, truth, expected", CASES)
def test_digit_match_is_one_exactly_when_exact_match_is(response, truth, expected):
    from rlhf.rewards import digit_match_score

    assert (digit_match_score(response, truth) == 1.0) == (expected == 1.0)
