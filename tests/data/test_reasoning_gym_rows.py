"""Prompt rows from reasoning-gym: verl's schema, disjoint splits, parquet round trips, `rlhf data prepare`."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("reasoning_gym", reason="reasoning-gym is not installed (pip install -e '.[tasks]')")

from rlhf.cli import main as rlhf_main  # noqa: E402
from rlhf.data import read_rows, validate_row, write_rows  # noqa: E402
from rlhf.data.generators import arithmetic_rows, problem_split  # noqa: E402
from rlhf.data.prepare import main as prepare  # noqa: E402
from rlhf.data.reasoning_gym import ANSWER_INSTRUCTION, TEST_PERCENT, reasoning_gym_rows  # noqa: E402
from rlhf.data.sources import load_rows  # noqa: E402
from rlhf.rewards import RewardManager, default_scorers  # noqa: E402
from rlhf.rewards.reasoning_gym import metadata_from_json  # noqa: E402


def test_rows_have_the_schema_of_our_generators():
    row = reasoning_gym_rows("leg_counting", 1)[0]
    assert row.keys() == arithmetic_rows(1)[0].keys()
    assert row["data_source"] == "reasoning_gym/leg_counting" and row["ability"] == "reasoning"
    question = row["extra_info"]["question"]  # reasoning-gym's own text
    assert row["prompt"] == [{"role": "user", "content": f"{question.rstrip()}\n\n{ANSWER_INSTRUCTION}"}]
    assert question.startswith("Your task is to count how many legs")
    assert row["reward_model"] == {"style": "rule", "ground_truth": row["extra_info"]["answer"]}
    assert row["extra_info"].keys() == {"split", "index", "task", "question", "answer", "metadata_json"}
    assert ANSWER_INSTRUCTION == 'End your reply with "The answer is <answer>."'
    validate_row(row, source="rows", index=0)


def test_rows_are_deterministic_and_take_the_instruction_and_difficulty():
    assert reasoning_gym_rows("chain_sum", 5, seed=1) == reasoning_gym_rows("chain_sum", 5, seed=1)
    assert reasoning_gym_rows("chain_sum", 5, seed=1) != reasoning_gym_rows("chain_sum", 5, seed=2)
    rows = reasoning_gym_rows("chain_sum", 20, instruction="Go.", min_terms=2, max_terms=2, max_digits=1)
    assert all(r["prompt"][0]["content"].endswith("\n\nGo.") for r in rows)
    assert all(r["extra_info"]["question"].count("+") + r["extra_info"]["question"].count("-") == 1 for r in rows)
    assert reasoning_gym_rows("chain_sum", 0) == []


def test_train_and_test_never_share_a_question_whatever_the_seeds():
    train = {r["extra_info"]["question"] for seed in (0, 1) for r in reasoning_gym_rows("basic_arithmetic", 300, seed)}
    test = [r["extra_info"]["question"] for seed in (0, 1)
            for r in reasoning_gym_rows("basic_arithmetic", 300, seed, split="test")]
    assert not train & set(test)
    assert all(problem_split(q, TEST_PERCENT) == "test" for q in test)  # how: a hash of the question picks its split
    one_seed = [r["extra_info"]["question"] for r in reasoning_gym_rows("basic_arithmetic", 300, 0, split="test")]
    assert len(set(one_seed)) == 300  # test rows never repeat a question


def test_rows_do_not_depend_on_the_python_hash_seed():
    # isomorphic_strings draws letters from a set (`rng.choice(list(letters - used))`): in-process, its rows
    # differed between PYTHONHASHSEED=1 and =2; they are drawn under a fixed hash seed instead
    script = ("import json, sys; from rlhf.data.reasoning_gym import reasoning_gym_rows; "
              "json.dump(reasoning_gym_rows('isomorphic_strings', 40, seed=3, split='test'), sys.stdout)")
    def rows_with_hash_seed(hash_seed: str) -> list[dict]:
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        return json.loads(subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                                         check=True).stdout)
    rows = reasoning_gym_rows("isomorphic_strings", 40, seed=3, split="test")
    assert rows_with_hash_seed("1") == rows_with_hash_seed("2") == rows_with_hash_seed("0") == rows
    assert len({r["extra_info"]["question"] for r in rows}) == 40


def test_a_task_with_too_few_questions_says_so():
    # chain_sum with two one-digit terms and no negation: 2 operators x 10 x 10 = 200 questions, ~100 per split
    with pytest.raises(ValueError, match=r"found only \d+ distinct test questions of the 150 asked for.*widen"):
        reasoning_gym_rows("chain_sum", 150, split="test", min_terms=2, max_terms=2, max_digits=1)


def test_unknown_task_and_bad_arguments():
    with pytest.raises(ValueError, match=r"no task 'word_sortin'\. Did you mean 'word_sorting'\?.*leg_counting"):
        reasoning_gym_rows("word_sortin", 3)
    with pytest.raises(ValueError, match='split must be "train" or "test"'):
        reasoning_gym_rows("leg_counting", 3, split="val")
    with pytest.raises(ValueError, match="no setting 'num_legs'; its settings: min_animals"):
        reasoning_gym_rows("leg_counting", 3, num_legs=4)


def test_a_missing_reasoning_gym_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # `import reasoning_gym` raises ImportError
    with pytest.raises(ImportError, match=r"reasoning-gym is not installed.*\[tasks\]"):
        reasoning_gym_rows("leg_counting", 1)


def _right(row: dict) -> str:
    """A right answer: the ground truth, or for a task without one answer, the example reasoning-gym gives."""
    truth = row["reward_model"]["ground_truth"]
    return truth or metadata_from_json(row["extra_info"]["metadata_json"])["example_answer"]


# propositional_logic's scorer reads metadata (the premises), arc_agi's compares tuples of tuples
@pytest.mark.parametrize("task", ["leg_counting", "word_sorting", "propositional_logic", "arc_agi"])
def test_parquet_round_trip_keeps_the_scorer_working(tmp_path, task):
    rows = reasoning_gym_rows(task, 8, split="test")
    path = write_rows(rows, tmp_path / "test.parquet")
    arrow = [json.loads(r["row"]) for r in load_rows(str(path), cache_dir=str(tmp_path / "cache"))]  # training's read
    for back in (read_rows(path)[0], arrow):
        truths = [r["reward_model"]["ground_truth"] for r in back]
        out = RewardManager(default_scorers())([f"Answer: {_right(r)}" for r in back], [r["data_source"] for r in back],
                                               truths, [r["extra_info"] for r in back])
        assert min(out.scores) > 0.2 and sum(out.scores) >= 7  # propositional_logic: 0.25 for a trivial conclusion


def test_cli_writes_both_splits_and_lists_the_tasks_for_a_typo(tmp_path, capsys):
    out = tmp_path / "leg"
    assert rlhf_main(["data", "prepare", "reasoning_gym/leg_counting", "--out", str(out), "--size", "20"]) == 0
    train, test = read_rows(out / "train.parquet")[0], read_rows(out / "test.parquet")[0]
    assert (len(train), len(test)) == (20, 100)  # test: the generated tasks' default
    assert train == reasoning_gym_rows("leg_counting", 20) and test == reasoning_gym_rows("leg_counting", 100,
                                                                                          split="test")
    assert prepare(["reasoning_gym/chain_sum", "--out", str(tmp_path / "c"), "--n", "4", "--n-test", "4",
                    "--set", "min_terms=2", "--set", "max_terms=2"]) == 0
    two_terms = [r["extra_info"]["question"].split(":")[1] for r in read_rows(tmp_path / "c" / "train.parquet")[0]]
    assert all(q.count("+") + q.count("-") == 1 for q in two_terms)
    capsys.readouterr()
    assert prepare(["reasoning_gym/leg_countin", "--out", str(tmp_path / "x")]) == 1
    assert "Did you mean 'leg_counting'?" in capsys.readouterr().err
    assert prepare(["reasoning_gym/chain_sum", "--out", str(tmp_path / "x"), "--set", "min_termz=2"]) == 1
    assert "its settings: min_terms" in capsys.readouterr().err
    assert prepare(["arithmetic", "--out", str(tmp_path / "x"), "--set", "min_terms=2"]) == 1
    assert "--set and --instruction are for reasoning_gym/<task> only" in capsys.readouterr().err
    assert prepare(["reasoning_gym/leg_counting", "--out", str(tmp_path / "i"), "--n", "2", "--n-test", "2",
                    "--instruction", "Answer: <n>"]) == 0
    assert read_rows(tmp_path / "i" / "test.parquet")[0] == reasoning_gym_rows("leg_counting", 2, split="test",
                                                                               instruction="Answer: <n>")
    assert prepare(["reasoning", "--out", str(tmp_path / "x")]) == 2
    assert "reasoning_gym/<task>" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
