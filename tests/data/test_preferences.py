"""Preference rows: TRL's layouts read into one form, row-level errors, and PreferenceDataset's batches."""

import json
import warnings

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st
import torch

from rlhf.data.preferences import (
    PreferenceDataset,
    load_preference_rows,
    longer_chosen_share,
    normalize_preference_row,
    pairs_from_samples,
    preference_pairs,
    write_preference_rows,
)
from rlhf.data.schema import DataError
from rlhf.data.sft import SFTDataset, load_sft_rows
from rlhf.data.sources import load_rows
from rlhf.models.loading import load_tokenizer
from helpers import tiny_model_path

EOT = "<|im_end|>"
USER = {"role": "user", "content": "What is 2+2?"}
GOOD = {"role": "assistant", "content": "4"}
BAD = {"role": "assistant", "content": "5, I think"}
CANONICAL = {"prompt": [USER], "chosen": [GOOD], "rejected": [BAD], "extra_info": {}}


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(tiny_model_path())


def norm(row):
    return normalize_preference_row(row, source="f.jsonl", index=3)


# ------------------------------------------------------------------ layouts
@pytest.mark.parametrize("row", [
    {"prompt": [USER], "chosen": [GOOD], "rejected": [BAD]},  # TRL conversational
    {"chosen": [USER, GOOD], "rejected": [USER, BAD]},  # TRL conversational, implicit prompt
    {"prompt": [USER], "chosen": [USER, GOOD], "rejected": [USER, BAD]},  # whole conversations after the prompt
    {"prompt": USER["content"], "chosen": GOOD["content"], "rejected": BAD["content"]},  # TRL standard (strings)
    {"prompt": [USER], "chosen": [GOOD], "rejected": [BAD], "extra_info": None},  # parquet's None = absent
], ids=["conversational", "implicit-prompt", "whole-conversations", "standard", "none-extra-info"])
def test_every_layout_becomes_the_same_row(row):
    assert norm(row) == CANONICAL


def test_optional_fields_are_kept_and_checked():
    row = norm({**CANONICAL, "margin": 2, "data_source": "arith", "extra_info": {"k": 1}, "reward_model": {"x": 1}})
    assert row["margin"] == 2.0 and isinstance(row["margin"], float)
    assert row["data_source"] == "arith" and row["extra_info"] == {"k": 1} and row["reward_model"] == {"x": 1}


def test_multi_turn_completion_and_prompt_with_assistant_turns():
    prompt = [USER, {"role": "assistant", "content": "Let me see."}, {"role": "user", "content": "Go on."}]
    tool_turns = [{"role": "assistant", "content": "calc(2+2)"}, {"role": "tool", "content": "4"}, GOOD]
    row = norm({"chosen": prompt + tool_turns, "rejected": prompt + [BAD]})
    assert row["prompt"] == prompt and row["chosen"] == tool_turns and row["rejected"] == [BAD]


@pytest.mark.parametrize("row, field, words", [
    ({"prompt": [USER], "rejected": [BAD]}, "chosen", "is missing"),
    ({"messages": [USER, GOOD]}, "chosen", "SFT chat row"),
    ({"prompt": "q", "completion": "a", "label": True}, "chosen", "unpaired (KTO)"),
    ({"prompt": [USER], "chosen": [USER], "rejected": [BAD]}, "chosen[0].role", "start with the assistant"),
    ({"prompt": [USER], "chosen": [], "rejected": [BAD]}, "chosen", "non-empty list"),
    ({"prompt": [USER], "chosen": [{"role": "assistant", "content": 4}], "rejected": [BAD]}, "chosen[0]", "string"),
    ({"chosen": [GOOD], "rejected": [BAD]}, "prompt", "share no first messages"),
    ({"chosen": "4", "rejected": "5"}, "prompt", "plain strings"),
    ({**CANONICAL, "margin": "big"}, "margin", "finite number"),
    ({**CANONICAL, "margin": float("nan")}, "margin", "finite number"),
    ({**CANONICAL, "data_source": ""}, "data_source", "non-empty string"),
    ({**CANONICAL, "extra_info": [1]}, "extra_info", "must be a dict"),
    ({**CANONICAL, "prompt": [{"role": "narrator", "content": "x"}]}, "prompt[0].role", "not a chat role"),
    ("just text", "<row>", "not a dict"),
])
def test_errors_name_file_row_and_field(row, field, words):
    with pytest.raises(DataError) as err:
        norm(row)
    assert err.value.field == field and err.value.index == 3
    assert str(err.value).startswith(f"f.jsonl, row 3: field {field!r}") and words in str(err.value)
    assert "Fix:" in str(err.value)


def write(path, rows):
    if path.suffix == ".parquet":
        keys = list(dict.fromkeys(k for r in rows for k in r))  # from_pylist would keep the first row's keys only
        pq.write_table(pa.table({k: [r.get(k) for r in rows] for k in keys}), path)
    elif path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        path.write_text(json.dumps(rows))
    return path


TRL_ROWS = [{"prompt": [USER], "chosen": [GOOD], "rejected": [BAD]},
            {"prompt": [{"role": "user", "content": "3+3?"}], "chosen": [{"role": "assistant", "content": "6"}],
             "rejected": [{"role": "assistant", "content": "7"}], "margin": 0.5}]


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl", ".json", "save_to_disk", "parquet-folder"])
def test_files_and_datasets_folders_read_the_same(tmp_path, suffix):
    if suffix == "save_to_disk":
        path = tmp_path / "ds"
        columns = {k: [r.get(k) for r in TRL_ROWS] for k in ("prompt", "chosen", "rejected", "margin")}
        datasets.DatasetDict({"train": datasets.Dataset.from_dict(columns)}).save_to_disk(str(path))
    elif suffix == "parquet-folder":
        (tmp_path / "folder").mkdir()
        write(tmp_path / "folder" / "train.parquet", TRL_ROWS)
        path = tmp_path / "folder"
    else:
        path = write(tmp_path / f"pairs{suffix}", TRL_ROWS)
    rows = load_preference_rows(str(path))
    assert rows == [{**CANONICAL}, {**norm(TRL_ROWS[1])}]
    assert load_preference_rows(str(path), limit=1) == rows[:1]


def test_file_errors_name_the_line(tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_text(json.dumps(TRL_ROWS[0]) + "\n\n" + json.dumps({"prompt": [USER], "chosen": [GOOD]}) + "\n")
    with pytest.raises(DataError, match=r"pairs.jsonl, row 1 \(line 3\): field 'rejected' is missing"):
        load_preference_rows(str(path))
    with pytest.raises(DataError, match="no such data file"):
        load_preference_rows(str(tmp_path / "absent.parquet"))
    with pytest.raises(DataError, match="no split 'test'"):
        datasets.DatasetDict({"train": datasets.Dataset.from_list(TRL_ROWS)}).save_to_disk(str(tmp_path / "ds"))
        load_preference_rows(str(tmp_path / "ds"), split="test")


def test_write_then_read_round_trips(tmp_path):
    rows = [norm(r) for r in TRL_ROWS] + [norm({**CANONICAL, "extra_info": {"score": 1.0}, "data_source": "a"})]
    for suffix in (".parquet", ".jsonl"):
        assert load_preference_rows(str(write_preference_rows(rows, tmp_path / f"out{suffix}"))) == rows
    with pytest.raises(DataError, match="rows for .*row 0: field 'rejected'"):
        write_preference_rows([{"prompt": [USER], "chosen": [GOOD]}], tmp_path / "bad.parquet")
    assert not (tmp_path / "bad.parquet").exists()


# ------------------------------------------------------------ SFT friction
def test_sft_refuses_a_preference_file_and_says_where_pairs_go(tmp_path):
    trl = write(tmp_path / "trl.jsonl", TRL_ROWS)  # no data_source: must not say "data_source is missing"
    verl_like = write(tmp_path / "verl.parquet", [{**r, "data_source": "arithmetic",
                                                   "reward_model": {"ground_truth": "4"}} for r in TRL_ROWS])
    for path in (trl, verl_like):
        with pytest.raises(DataError) as err:
            load_sft_rows(str(path))
        message = str(err.value)
        assert "preference row" in message and "rlhf dpo" in message and "reward model" in message
        assert "'data_source' is missing" not in message and "row 0" in message and str(path) in message
    with pytest.raises(DataError, match="preference row"):
        SFTDataset([{**TRL_ROWS[0], "data_source": "a", "reward_model": {"ground_truth": "4"}}], load_tokenizer(
            tiny_model_path()))
    with pytest.raises(DataError, match="preference row .* give each row data_source"):
        load_rows(str(trl))


# ------------------------------------------------------------------ dataset
def pairs(n):
    return [{"prompt": [{"role": "user", "content": f"{k}+{k}?"}],
             "chosen": [{"role": "assistant", "content": str(2 * k)}],
             "rejected": [{"role": "assistant", "content": f"{2 * k + 1} or so"}], "margin": float(k)}
            for k in range(n)]


def test_batch_puts_chosen_and_rejected_side_by_side(tok):
    data = PreferenceDataset(pairs(3), tok, max_length=64)
    batch = data.collate([2, 0])
    assert len(batch) == 4 and batch["margin"].tolist() == [2.0, 2.0, 0.0, 0.0]
    texts = [tok.decode(batch["responses"][i][batch["response_mask"][i].bool()]) for i in range(4)]
    assert texts == ["4" + EOT, "5 or so" + EOT, "0" + EOT, "1 or so" + EOT]
    t = batch["input_ids"].shape[1] - batch["responses"].shape[1]
    for i in (0, 2):  # one prompt for both rows of a pair, rendered as generation would see it
        assert torch.equal(batch["input_ids"][i, :t], batch["input_ids"][i + 1, :t])
        prompt = batch["input_ids"][i, :t][batch["attention_mask"][i, :t].bool()]
        k = 2 if i == 0 else 0
        assert tok.decode(prompt) == tok.apply_chat_template([{"role": "user", "content": f"{k}+{k}?"}],
                                                             add_generation_prompt=True, tokenize=False)
    assert torch.equal(batch["position_ids"][0][batch["attention_mask"][0].bool()],
                       torch.arange(int(batch["attention_mask"][0].sum())))
    assert batch.meta["temperature"] == 1.0
    assert list(batch["uid"]) == [2, 2, 0, 0] and batch["pair_index"].tolist() == [2, 2, 0, 0]


def test_prompt_assistant_turns_carry_no_loss(tok):
    prompt = [USER, {"role": "assistant", "content": "Hmm."}, {"role": "user", "content": "Well?"}]
    batch = PreferenceDataset([{"prompt": prompt, "chosen": [GOOD], "rejected": [BAD]}], tok).collate([0])
    assert tok.decode(batch["responses"][0][batch["response_mask"][0].bool()]) == "4" + EOT
    assert "Hmm." not in tok.decode(batch["responses"][0])


def test_over_long_pairs_are_dropped_and_counted(tok):
    rows = pairs(4)
    rows[1]["rejected"] = [{"role": "assistant", "content": "x" * 200}]
    with pytest.warns(UserWarning, match="dropped 1 of 4 preference pairs"):
        data = PreferenceDataset(rows, tok, max_length=64)
    assert len(data) == 3 and data.num_filtered == 1
    with pytest.raises(DataError, match="every pair is longer than max_length=5"):
        PreferenceDataset(rows, tok, max_length=5)


def test_shuffled_resumes_exactly_and_in_order_covers_every_pair(tok):
    data = PreferenceDataset(pairs(7), tok, max_length=64)
    for bucketed in (False, True):
        run = data.shuffled(2, seed=3, bucketed=bucketed)
        first = [next(run) for _ in range(6)]
        resumed = data.shuffled(2, seed=3, start_step=4, bucketed=bucketed)
        for a, b in zip(first[4:], [next(resumed), next(resumed)]):
            assert all(torch.equal(a[k], b[k]) for k in a.tensors) and list(a["uid"]) == list(b["uid"])
    seen = torch.cat([b["margin"][::2] for b in data.in_order(3)])
    assert seen.tolist() == [float(k) for k in range(7)]


def test_fingerprint_follows_the_rows(tok):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        a = PreferenceDataset(pairs(3), tok).fingerprint
    assert a == PreferenceDataset(pairs(3), tok).fingerprint != PreferenceDataset(pairs(4), tok).fingerprint


def test_pairs_from_samples_takes_best_and_worst():
    row = {"prompt": [USER], "data_source": "arithmetic", "reward_model": {"ground_truth": "4"}, "extra_info": {"i": 1}}
    pair = pairs_from_samples(row, ["a", "b", "c", "d"], [0.5, 1.0, 0.0, 1.0], with_margin=True)
    assert pair["chosen"][0]["content"] == "b" and pair["rejected"][0]["content"] == "c"  # first of the tied best
    assert pair["margin"] == 1.0 and pair["extra_info"] == {"i": 1, "chosen_score": 1.0, "rejected_score": 0.0}
    assert pair["data_source"] == "arithmetic" and pair["reward_model"] == {"ground_truth": "4"}
    assert norm(pair)["chosen"] == pair["chosen"]
    assert pairs_from_samples(row, ["a", "b"], [1.0, 1.0]) is None


def test_length_matched_pairs_take_the_closest_lengths_among_the_ties():
    row = {"prompt": [USER], "data_source": "arithmetic"}
    answers, scores = ["a" * 40, "b" * 10, "c" * 12, "d" * 30, "e" * 2], [1.0, 1.0, 0.0, 0.0, 0.5]
    plain = pairs_from_samples(row, answers, scores)
    assert (plain["chosen"][0]["content"][0], plain["rejected"][0]["content"][0]) == ("a", "c")  # first of each tie
    matched = pairs_from_samples(row, answers, scores, length_matched=True)
    assert (matched["chosen"][0]["content"][0], matched["rejected"][0]["content"][0]) == ("b", "c")  # 10 vs 12
    assert matched["extra_info"] == {"chosen_score": 1.0, "rejected_score": 0.0}
    assert pairs_from_samples(row, answers, [1.0] * 5, length_matched=True) is None


@pytest.mark.parametrize("chosen_longer, matched, expected", [
    (True, True, ("a", "d")),    # 40 vs 30: the closest pair whose chosen is longer
    (False, True, ("b", "c")),   # 10 vs 12
    (True, False, ("a", "c")),   # the first pair on that side
    (False, False, ("b", "c")),
])
def test_chosen_longer_picks_a_side_among_the_ties(chosen_longer, matched, expected):
    row = {"prompt": [USER]}
    answers, scores = ["a" * 40, "b" * 10, "c" * 12, "d" * 30, "e" * 2], [1.0, 1.0, 0.0, 0.0, 0.5]
    pair = pairs_from_samples(row, answers, scores, length_matched=matched, chosen_longer=chosen_longer)
    assert (pair["chosen"][0]["content"][0], pair["rejected"][0]["content"][0]) == expected


def test_chosen_longer_keeps_the_label_where_the_ties_offer_no_such_side():
    pair = pairs_from_samples({"prompt": [USER]}, ["long answer", "no"], [1.0, 0.0], chosen_longer=False)
    assert (pair["chosen"][0]["content"], pair["rejected"][0]["content"]) == ("long answer", "no")


@given(st.lists(st.tuples(st.lists(st.integers(1, 30), min_size=2, max_size=6),
                          st.lists(st.sampled_from([0.0, 0.5, 1.0]), min_size=6, max_size=6)),
                min_size=1, max_size=40))
def test_length_balanced_pairs_keep_every_label_and_balance_what_the_ties_allow(prompts):
    rows, scores = [], []
    for lengths, row_scores in prompts:
        rows.append({"prompt": [USER], "responses": [chr(97 + k) * n for k, n in enumerate(lengths)]})
        scores.append(row_scores[: len(lengths)])
    plain = preference_pairs(rows, scores)
    balanced = preference_pairs(rows, scores, length_balanced=True)
    assert [p is None for p in plain] == [p is None for p in balanced]  # the same prompts give pairs
    for row, row_scores, pair in zip(rows, scores, balanced):
        if pair is None:
            continue
        chosen, rejected = (row["responses"].index(pair[side][0]["content"]) for side in ("chosen", "rejected"))
        assert row_scores[chosen] == max(row_scores) and row_scores[rejected] == min(row_scores)  # labels kept
    # the running imbalance never grows while a prompt could have gone the other way
    longer = shorter = 0
    for row, row_scores, pair in zip(rows, scores, balanced):
        if pair is None:
            continue
        lengths = {len(r) for r, s in zip(row["responses"], row_scores) if s == max(row_scores)}
        bottoms = {len(r) for r, s in zip(row["responses"], row_scores) if s == min(row_scores)}
        could_longer = any(b > w for b in lengths for w in bottoms)
        could_shorter = any(b < w for b in lengths for w in bottoms)
        c, r = len(pair["chosen"][0]["content"]), len(pair["rejected"][0]["content"])
        if longer <= shorter and could_longer:
            assert c > r
        elif longer > shorter and could_shorter:
            assert c < r
        longer += c > r
        shorter += c < r


def test_length_balanced_pairs_balance_a_data_set_that_leans_long():
    # every prompt: two right answers (long, short) and two wrong ones (medium): unbalanced, the first right wins
    rows = [{"prompt": [USER], "responses": ["x" * 30, "y" * 5, "z" * 10, "w" * 12]} for _ in range(100)]
    scores = [[1.0, 1.0, 0.0, 0.0]] * 100
    assert longer_chosen_share([p for p in preference_pairs(rows, scores) if p]) == 1.0
    assert longer_chosen_share([p for p in preference_pairs(rows, scores, length_balanced=True) if p]) == 0.5


@pytest.mark.parametrize("lengths, share", [([(5, 3)], 1.0), ([(3, 5)], 0.0), ([(4, 4)], 0.5),
                                            ([(5, 3), (3, 5), (4, 4), (9, 1)], 0.625), ([], None)])
def test_longer_chosen_share(lengths, share):
    pairs = [{"chosen": [{"role": "assistant", "content": "c" * c}], "rejected": "r" * r} for c, r in lengths]
    assert longer_chosen_share(pairs) == share
