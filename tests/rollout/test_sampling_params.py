"""`SamplingParams` refuses a bad value when built, with the range its signature's marker states (the same
checker and text as preflight's), naming the field and the value."""

import pytest

from rlhf.rollout.sampling import SamplingParams


@pytest.mark.parametrize("field, value, message", [
    ("n", 0, "SamplingParams.n = 0: expects int > 0"),
    ("n", 2.0, "SamplingParams.n = 2.0: expects int > 0"),
    ("temperature", -0.1, "SamplingParams.temperature = -0.1: expects float >= 0"),
    ("top_p", 0.0, "SamplingParams.top_p = 0.0: expects float in (0, 1]"),
    ("top_p", 1.5, "SamplingParams.top_p = 1.5: expects float in (0, 1]"),
    ("top_k", -1, "SamplingParams.top_k = -1: expects int >= 0"),
    ("max_new_tokens", 0, "SamplingParams.max_new_tokens = 0: expects int > 0"),
    ("max_new_tokens", "32", "SamplingParams.max_new_tokens = '32': expects int > 0"),
    ("min_new_tokens", -1, "SamplingParams.min_new_tokens = -1: expects int >= 0"),
])
def test_a_bad_value_is_named_with_its_range(field, value, message):
    with pytest.raises(ValueError) as error:
        SamplingParams(**{field: value})
    assert str(error.value) == message


def test_min_new_tokens_is_at_most_max_new_tokens():
    SamplingParams(max_new_tokens=4, min_new_tokens=4)
    with pytest.raises(ValueError, match=r"min_new_tokens = 5: expects at most max_new_tokens = 4"):
        SamplingParams(max_new_tokens=4, min_new_tokens=5)


def test_every_bad_field_is_named_at_once():
    with pytest.raises(ValueError, match=r"^SamplingParams.n = 0: .*; SamplingParams.top_p = 2: "):
        SamplingParams(n=0, top_p=2)
