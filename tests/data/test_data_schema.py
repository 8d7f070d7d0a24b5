"""validate_row: good rows pass; each kind of bad row names source, row, field and a fix."""

import copy

import numpy as np
import pytest

from rlhf.data import DataError, ground_truth, to_python, validate_row


def good_row() -> dict:
    return {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "system", "content": ""}, {"role": "user", "content": "What is 2+3?"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "5"},
        "extra_info": {"split": "train", "index": 0},
    }


def test_good_row_passes():
    validate_row(good_row(), source="train.jsonl", index=0)  # no DataError
    with pytest.raises(DataError):  # the control: the validator is not one that accepts everything
        validate_row({**good_row(), "prompt": "What is 2+3?"}, source="train.jsonl", index=0)


def test_optional_fields_may_be_absent():
    row = good_row()
    del row["ability"], row["extra_info"], row["reward_model"]["style"]
    validate_row(row, source="train.jsonl", index=0)  # no DataError
    del row["data_source"]
    with pytest.raises(DataError, match="data_source"):  # a required one may not
        validate_row(row, source="train.jsonl", index=0)


def test_dict_ground_truth_is_accepted_for_tinyzero_countdown_data():
    row = good_row()
    row["reward_model"]["ground_truth"] = {"target": 24, "numbers": [2, 3, 4]}
    validate_row(row, source="countdown.parquet", index=0)  # no DataError
    assert ground_truth(row) == '{"numbers": [2, 3, 4], "target": 24}'


def _set(path, value):
    def mutate(row):
        target = row
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return mutate


def _delete(path):
    def mutate(row):
        target = row
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]

    return mutate


BAD_ROWS = [
    # (what breaks the row, the field the message names, words the message must contain)
    (_delete(["data_source"]), "data_source", "missing"),
    (_set(["data_source"], 3), "data_source", "non-empty string"),
    (_set(["data_source"], "  "), "data_source", "non-empty string"),
    (_delete(["prompt"]), "prompt", "missing"),
    (_set(["prompt"], "What is 2+3?"), "prompt", "plain string"),
    (_set(["prompt"], []), "prompt", "empty list"),
    (_set(["prompt"], {"role": "user"}), "prompt", "list of chat messages"),
    (_set(["prompt"], np.array([{"role": "user", "content": "x"}])), "prompt", "numpy array"),
    (_set(["prompt", 1], "hello"), "prompt[1]", "dict with role and content"),
    (_delete(["prompt", 1, "content"]), "prompt[1].content", "missing"),
    (_delete(["prompt", 0, "role"]), "prompt[0].role", "missing"),
    (_set(["prompt", 1, "role"], "human"), "prompt[1].role", "not a chat role"),
    (_set(["prompt", 1, "content"], 5), "prompt[1].content", "must be a string, got int 5"),
    (_set(["prompt", 1, "content"], None), "prompt[1].content", "must be a string"),
    (_set(["prompt", 1, "content"], "   "), "prompt", "only empty messages"),
    (_set(["ability"], 1), "ability", "must be a string"),
    (_delete(["reward_model"]), "reward_model", "missing"),
    (_set(["reward_model"], "5"), "reward_model", "must be a dict"),
    (_delete(["reward_model", "ground_truth"]), "reward_model.ground_truth", "missing"),
    (_set(["reward_model", "ground_truth"], None), "reward_model.ground_truth", "missing"),
    (_set(["reward_model", "ground_truth"], 5), "reward_model.ground_truth", 'as a string, e.g. "5"'),
    (_set(["reward_model", "style"], 1), "reward_model.style", "must be a string"),
    (_set(["extra_info"], [1, 2]), "extra_info", "must be a dict"),
]


@pytest.mark.parametrize("mutate, field, words", BAD_ROWS)
def test_bad_row_message_names_source_row_field_and_fix(mutate, field, words):
    row = good_row()
    mutate(row)
    with pytest.raises(DataError) as info:
        validate_row(row, source="data/train.parquet", index=17)
    message = str(info.value)
    assert message.startswith("data/train.parquet, row 17: ")
    assert f"field {field!r}" in message
    assert words in message
    assert "Fix: " in message
    assert (info.value.source, info.value.index, info.value.field) == ("data/train.parquet", 17, field)


def test_line_number_is_added_when_known():
    row = good_row()
    del row["prompt"]
    with pytest.raises(DataError, match=r"^train\.jsonl, row 3 \(line 5\): field 'prompt' is missing"):
        validate_row(row, source="train.jsonl", index=3, line=5)


def test_non_mapping_row():
    with pytest.raises(DataError, match="row 0: field '<row>' is a list, not a dict"):
        validate_row(["data_source", "x"], source="gen", index=0)


def test_validation_does_not_modify_the_row():
    row = good_row()
    before = copy.deepcopy(row)
    validate_row(row, source="x", index=0)
    assert row == before


def test_data_errors_are_caught_as_value_errors():
    with pytest.raises(ValueError):  # callers that catch ValueError (bad input) catch bad rows too
        validate_row(["data_source", "x"], source="gen", index=0)


def test_ground_truth_string_and_dict():
    assert ground_truth(good_row()) == "5"
    row = good_row()
    row["reward_model"]["ground_truth"] = {"target": 24, "numbers": np.array([2, 3, 4])}
    assert ground_truth(row) == '{"numbers": [2, 3, 4], "target": 24}'


def test_ground_truth_missing_is_a_data_error():
    with pytest.raises(DataError, match="reward_model.ground_truth"):
        ground_truth({"reward_model": {}})


def test_to_python_converts_numpy_recursively():
    value = {
        "prompt": np.array([{"role": "user", "content": "x"}], dtype=object),
        "numbers": np.array([1, 2], dtype=np.int64),
        "index": np.int64(3),
        "score": np.float32(0.5),
    }
    out = to_python(value)
    assert out == {"prompt": [{"role": "user", "content": "x"}], "numbers": [1, 2], "index": 3, "score": 0.5}
    assert type(out["prompt"]) is list and type(out["numbers"][0]) is int and type(out["index"]) is int
