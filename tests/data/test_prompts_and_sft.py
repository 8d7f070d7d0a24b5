"""Tokenised datasets: chat template, left padding, response-only SFT targets, resumable order."""

import pytest
import torch

from rlhf.data.generators import arithmetic_rows, gsm8k_like_rows
from rlhf.data.prompts import PromptDataset
from rlhf.data.schema import DataError
from rlhf.data.sft import SFTDataset, answer_from_extra_info
from rlhf.models.loading import load_tokenizer
from helpers import tiny_model_path


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(tiny_model_path())


def test_prompts_are_chat_templated_and_left_padded(tok):
    data = PromptDataset(arithmetic_rows(4) + gsm8k_like_rows(1), tok)
    batch = data.collate(range(5))
    ids, mask = batch["input_ids"], batch["attention_mask"]
    assert mask[:, -1].all() and not mask[0, 0]  # left padding: every row ends with a real token
    text = tok.decode(ids[0][mask[0].bool()])
    assert text.startswith("<|im_start|>user\nWhat is ") and text.endswith("<|im_start|>assistant\n")
    assert batch["ground_truth"][0] == arithmetic_rows(4)[0]["reward_model"]["ground_truth"]
    assert len(set(batch["uid"])) == 5


def test_overlong_prompts_are_filtered_or_refused(tok):
    rows = arithmetic_rows(3) + gsm8k_like_rows(2)
    data = PromptDataset(rows, tok, max_prompt_length=40)
    assert len(data) == 3 and data.num_filtered == 2
    with pytest.raises(DataError, match="row 3 has a prompt of .* tokens"):
        PromptDataset(rows, tok, max_prompt_length=40, overlong="error")


def test_bad_row_is_reported_with_its_index(tok):
    rows = arithmetic_rows(2)
    rows[1] = {**rows[1], "prompt": []}
    with pytest.raises(DataError, match="row 1"):
        PromptDataset(rows, tok)


def test_shuffled_batches_resume_exactly(tok):
    data = PromptDataset(arithmetic_rows(10), tok)
    full = [b["uid"].tolist() for b, _ in zip(data.shuffled(3, seed=7), range(7))]
    resumed = [b["uid"].tolist() for b, _ in zip(data.shuffled(3, seed=7, start_step=4), range(3))]
    assert resumed == full[4:]
    assert sorted(sum(full[:3], [])) == sorted(set(sum(full[:3], [])))  # no repeats within an epoch


def test_sft_loss_mask_covers_exactly_the_answer_and_eos(tok):
    rows = arithmetic_rows(3)
    batch = SFTDataset(rows, tok).collate(range(3))
    for i, row in enumerate(rows):
        target = batch["responses"][i][batch["response_mask"][i].bool()]
        assert tok.decode(target) == row["reward_model"]["ground_truth"] + "<|im_end|>"
    r = batch["responses"].shape[1]
    assert torch.equal(batch["input_ids"][:, -r:], batch["responses"])
    assert torch.equal(batch["attention_mask"][:, -r:], batch["response_mask"])


def test_sft_worked_solutions_from_extra_info(tok):
    rows = gsm8k_like_rows(2)
    batch = SFTDataset(rows, tok, response=answer_from_extra_info).collate([0])
    text = tok.decode(batch["responses"][0][batch["response_mask"][0].bool()], skip_special_tokens=True)
    assert text == rows[0]["extra_info"]["answer"] and "####" in text


def test_missing_response_field_names_the_row(tok):
    rows = arithmetic_rows(2)
    with pytest.raises(DataError, match="row 0 has no response text"):
        SFTDataset(rows, tok, response=lambda row: row["extra_info"]["solution"])


def test_an_sft_stage_with_a_response_key_passes_the_preflight(tmp_path):
    """`rlhf sft --response-key` puts `fdl.Partial(answer_from_extra_info, key=...)` in the graph: the dataset's
    preflight hook leaves that node to the stage's build instead of calling it (it is not callable)."""
    from rlhf.data.files import write_rows
    from rlhf.runtime.preflight_hooks import hook_problems
    from rlhf_configs.sft import sft_stage

    rows = [{**row, "extra_info": {**row["extra_info"], "teacher_response": "The answer is 5."}}
            for row in arithmetic_rows(4)]
    path = write_rows(rows, tmp_path / "rows.parquet")
    assert hook_problems(sft_stage(tiny_model_path(), str(path), response_key="teacher_response")) == []
