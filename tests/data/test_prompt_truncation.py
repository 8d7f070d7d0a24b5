"""PromptDataset's overlong modes: filter, error, and verl's left / right / middle truncation."""

import warnings

import pytest
from helpers import tiny_model_path
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhf.data.generators import arithmetic_rows, gsm8k_like_rows
from rlhf.data.prompts import PromptDataset, truncate_ids
from rlhf.data.schema import DataError
from rlhf.data.tokenize import chat_prompt_ids
from rlhf.models.loading import load_tokenizer


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(tiny_model_path())


def test_truncate_ids_by_hand():
    ids = [0, 1, 2, 3, 4, 5, 6]
    assert truncate_ids(ids, 4, "left") == [3, 4, 5, 6]  # the last 4 (the assistant header survives)
    assert truncate_ids(ids, 4, "right") == [0, 1, 2, 3]  # the first 4
    assert truncate_ids(ids, 4, "middle") == [0, 1, 5, 6]  # 2 from each end
    assert truncate_ids(ids, 5, "middle") == [0, 1, 2, 5, 6]  # ceil(5/2)=3 from the left, 2 from the right
    assert truncate_ids(ids, 1, "middle") == [0]
    assert truncate_ids(ids, 9, "middle") == ids  # short enough: unchanged


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 9), max_size=30), st.integers(1, 30), st.sampled_from(["left", "right", "middle"]))
def test_truncate_ids_keeps_ends(ids, n, side):
    out = truncate_ids(ids, n, side)
    assert len(out) == min(n, len(ids))
    head = {"left": 0, "right": len(out), "middle": (len(out) + 1) // 2}[side] if len(ids) > n else len(out)
    assert out[:head] == ids[:head]  # a prefix of the original
    tail = len(out) - head
    assert out[len(out) - tail :] == ids[len(ids) - tail :]  # and a suffix


def test_filter_and_error_count(tok):
    rows = arithmetic_rows(3) + gsm8k_like_rows(2)
    with pytest.warns(UserWarning, match="filtered 2 prompts"):
        data = PromptDataset(rows, tok, max_prompt_length=40)
    assert len(data) == 3 and data.num_filtered == 2 and data.num_truncated == 0
    with pytest.raises(DataError, match="row 3 has a prompt of .* tokens.*truncate_left"):
        PromptDataset(rows, tok, max_prompt_length=40, overlong="error")


@pytest.mark.parametrize("mode, side", [("truncate_left", "left"), ("truncate_right", "right"),
                                        ("truncate_middle", "middle")])
def test_truncation_keeps_every_row(tok, mode, side):
    rows = arithmetic_rows(3) + gsm8k_like_rows(2)
    with pytest.warns(UserWarning, match=f"truncated 2 prompts longer than 40 tokens \\({mode}\\)"):
        data = PromptDataset(rows, tok, max_prompt_length=40, overlong=mode)
    assert len(data) == 5 and data.num_truncated == 2 and data.num_filtered == 0
    batch = data.collate(range(5))
    assert batch["input_ids"].shape[1] == 40
    for i, row in enumerate(rows):
        full = chat_prompt_ids(tok, row["prompt"])
        kept = batch["input_ids"][i][batch["attention_mask"][i].bool()].tolist()
        assert kept == truncate_ids(full, 40, side)
    assert batch["ground_truth"][3] == rows[3]["reward_model"]["ground_truth"]  # the row itself is kept whole


def test_truncate_left_keeps_the_generation_prompt(tok):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        data = PromptDataset(gsm8k_like_rows(2), tok, max_prompt_length=30, overlong="truncate_left")
    text = tok.decode(data.ids[0])
    assert text.endswith("<|im_start|>assistant\n")


def test_no_truncation_when_short(tok):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning either
        data = PromptDataset(arithmetic_rows(3), tok, max_prompt_length=512, overlong="truncate_middle")
    assert data.num_truncated == 0


def test_bad_mode_and_length_are_refused(tok):
    with pytest.raises(ValueError, match="overlong must be one of"):
        PromptDataset(arithmetic_rows(1), tok, overlong="left")
    with pytest.raises(ValueError, match="max_prompt_length must be >= 1"):
        PromptDataset(arithmetic_rows(1), tok, max_prompt_length=0)


def test_raw_prompt_column_is_opt_in(tok):
    rows = arithmetic_rows(3)
    assert "raw_prompt" not in PromptDataset(rows, tok).collate([0, 1])
    batch = PromptDataset(rows, tok, raw_prompt=True).collate([2, 0])
    assert list(batch["raw_prompt"]) == [rows[2]["prompt"], rows[0]["prompt"]]
    assert len(batch.repeat(2)["raw_prompt"]) == 4  # follows the rows through generation's repeat
