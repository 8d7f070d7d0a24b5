"""Generators: valid rows, deterministic per seed, disjoint splits, solvable and self-consistent."""

import json
import re
from collections import Counter

import pytest

from rlhf.data import arithmetic_rows, countdown_rows, gsm8k_like_rows, validate_row
from rlhf.data.generators import GSM8K_INSTRUCTION, arithmetic_pairs
from rlhf.rewards import countdown_score, exact_match_score, gsm8k_flexible, gsm8k_strict

GENERATORS = [arithmetic_rows, gsm8k_like_rows, countdown_rows]


@pytest.mark.parametrize("generate", GENERATORS)
@pytest.mark.parametrize("split", ["train", "test"])
def test_rows_are_valid_and_indexed(generate, split):
    rows = generate(30, seed=3, split=split)
    assert len(rows) == 30
    for i, row in enumerate(rows):
        validate_row(row, source=generate.__name__, index=i)
        assert row["extra_info"]["split"] == split and row["extra_info"]["index"] == i
        assert row["reward_model"]["style"] == "rule"


@pytest.mark.parametrize("generate", GENERATORS)
def test_deterministic_per_seed(generate):
    assert generate(25, seed=7) == generate(25, seed=7)
    assert generate(25, seed=7) != generate(25, seed=8)
    assert generate(10, seed=7) == generate(25, seed=7)[:10]


@pytest.mark.parametrize("generate", GENERATORS)
def test_zero_rows_and_bad_arguments(generate):
    assert generate(0) == []
    with pytest.raises(ValueError, match="n must be a non-negative int"):
        generate(-1)
    with pytest.raises(ValueError, match='split must be "train" or "test"'):
        generate(3, split="validation")


def _problem(row) -> str:
    return row["prompt"][0]["content"] if row["data_source"] != "countdown" else row["reward_model"]["ground_truth"]


@pytest.mark.parametrize("generate", GENERATORS)
def test_train_and_test_never_share_a_problem_whatever_the_seeds(generate):
    train = {_problem(r) for seed in (0, 1) for r in generate(300, seed=seed, split="train")}
    test = {_problem(r) for seed in (0, 2) for r in generate(100, seed=seed, split="test")}
    assert not train & test


# ----------------------------------------------------------------------- arithmetic


def test_arithmetic_rows_content():
    for row in arithmetic_rows(200, seed=0):
        content = row["prompt"][0]["content"]
        a, b = map(int, re.fullmatch(r"What is (\d\d)\+(\d\d)\?", content).groups())
        assert 10 <= a <= 99 and 10 <= b <= 99
        assert len(content) < 24
        assert row["data_source"] == "arithmetic"
        assert row["reward_model"]["ground_truth"] == str(a + b)
        assert exact_match_score(f"{a + b}<|im_end|>", row["reward_model"]["ground_truth"]) == 1.0


def test_arithmetic_splits_partition_all_pairs():
    train, test = set(arithmetic_pairs("train")), set(arithmetic_pairs("test"))
    assert not train & test and len(train | test) == 90 * 90
    assert 600 <= len(test) <= 1000  # about 10%


def test_arithmetic_test_split_has_distinct_pairs_and_refuses_too_many():
    available = len(arithmetic_pairs("test"))
    rows = arithmetic_rows(available, split="test")
    assert len({r["prompt"][0]["content"] for r in rows}) == available
    with pytest.raises(ValueError, match=rf"only {available} distinct pairs.*n <= {available}"):
        arithmetic_rows(available + 1, split="test")


def test_arithmetic_train_repeats_pairs_evenly_when_n_exceeds_them():
    available = len(arithmetic_pairs("train"))
    rows = arithmetic_rows(2 * available + 5, seed=1)
    counts = Counter(r["prompt"][0]["content"] for r in rows)
    assert len(counts) == available and set(counts.values()) <= {2, 3}


# ----------------------------------------------------------------------- gsm8k-like


def test_gsm8k_like_rows_look_like_verl_gsm8k():
    rows = gsm8k_like_rows(300, seed=0)
    answers = [int(r["reward_model"]["ground_truth"]) for r in rows]
    assert all(r["data_source"] == "openai/gsm8k" for r in rows)
    assert all(r["prompt"][0]["content"] == f"{r['extra_info']['question']} {GSM8K_INSTRUCTION}" for r in rows)
    assert max(answers) >= 1000 and min(answers) >= 0  # thousands: comma handling matters
    assert len({r["extra_info"]["question"] for r in rows}) == 300
    # Every template is used.
    for word in ("change", "grandfather", "miles", "cookies", "factory", "save", "tomato"):
        assert any(word in r["extra_info"]["question"] for r in rows), word


def test_gsm8k_like_worked_solutions_are_correct_and_annotated():
    for row in gsm8k_like_rows(200, seed=5):
        solution, truth = row["extra_info"]["answer"], row["reward_model"]["ground_truth"]
        assert solution.endswith(f"\n#### {truth}")
        assert gsm8k_strict(solution, truth) == 1.0
        assert gsm8k_flexible(solution, truth) == 1.0
        # every <<a op b=c>> calculator annotation is true arithmetic
        for a, op, b, c in re.findall(r"<<(\d+)([-+*/])(\d+)=(\d+)>>", solution):
            a, b, c = int(a), int(b), int(c)
            assert {"+": a + b, "-": a - b, "*": a * b, "/": a / b}[op] == c
        assert len(re.findall("<<", solution)) >= 2


# ------------------------------------------------------------------------ countdown


@pytest.mark.parametrize("num_count", [3, 4])
def test_countdown_instances_are_solvable_by_their_stored_solution(num_count):
    for row in countdown_rows(150, seed=2, num_count=num_count, max_target=100):
        truth = json.loads(row["reward_model"]["ground_truth"])
        assert len(truth["numbers"]) == num_count and 1 <= truth["target"] <= 100
        assert all(1 <= x <= 99 for x in truth["numbers"])
        answer = f"<think>easy</think> <answer>{row['extra_info']['solution']}</answer>"
        assert countdown_score(answer, row["reward_model"]["ground_truth"]) == 1.0
        assert f"Using the numbers {truth['numbers']}" in row["prompt"][0]["content"]
        assert "<answer>" in row["prompt"][0]["content"]


def test_countdown_respects_max_target_and_rejects_bad_num_count():
    assert all(json.loads(r["reward_model"]["ground_truth"])["target"] <= 10 for r in countdown_rows(50, max_target=10))
    with pytest.raises(ValueError, match="num_count must be in 2..6"):
        countdown_rows(3, num_count=1)
