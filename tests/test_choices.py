"""String switches are checked against their Literal type where they arrive, naming the allowed values."""

import pytest

from rlhf.choices import check_choice
from rlhf.data.arrow import OnError, validate_dataset
from rlhf.data.streaming import stream_file


def test_check_choice_names_the_allowed_values():
    check_choice("x: on_error", "skip", OnError)
    with pytest.raises(ValueError, match=r"^x: on_error must be one of 'raise', 'skip', got 'ignore'$"):
        check_choice("x: on_error", "ignore", OnError)


@pytest.mark.parametrize("call, message", [
    (lambda: stream_file("rows.jsonl", on_error="skp"), r"stream_file: on_error must be one of 'raise', 'skip'"),
    (lambda: stream_file("rows.jsonl", kind="chat"), r"stream_file: kind must be one of 'prompt', 'generation', 'sft'"),
    (lambda: validate_dataset(None, source="s", kind="chat"), r"validate_dataset: kind must be one of 'prompt', 'generation', 'sft'"),
])
def test_a_typo_fails_before_any_row_is_read(call, message):
    with pytest.raises(ValueError, match=message):
        call()
