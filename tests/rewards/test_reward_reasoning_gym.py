"""reasoning-gym's scorers as the reward of data_source "reasoning_gym/<task>", found by the registry's family key."""

import pytest

pytest.importorskip("reasoning_gym", reason="reasoning-gym is not installed (pip install -e '.[tasks]')")

from rlhf.data.reasoning_gym import reasoning_gym_rows  # noqa: E402
from rlhf.rewards import RULES, RewardManager, default_extractors, default_scorers  # noqa: E402
from rlhf.rewards.final_answer import final_answer  # noqa: E402
from rlhf.rewards.reasoning_gym import (  # noqa: E402
    metadata_from_json,
    metadata_json,
    reasoning_gym_lenient_score,
    reasoning_gym_score,
    task_dataset,
)
from rlhf.rewards.registry import rule_key  # noqa: E402
from rlhf.trainers.eval_job import evaluate_scores  # noqa: E402

TASKS = ["leg_counting", "basic_arithmetic", "word_sorting", "letter_counting", "chain_sum"]


def _row(task: str) -> dict:
    return reasoning_gym_rows(task, 1, seed=3, split="test")[0]


@pytest.mark.parametrize("task", TASKS)
def test_right_in_the_format_scores_1_right_without_it_only_leniently_and_wrong_0(task):
    row = _row(task)
    truth, extra = row["reward_model"]["ground_truth"], row["extra_info"]
    assert reasoning_gym_score(f"Let me think.\nAnswer: {truth}", truth, extra) == {
        "score": 1.0, "lenient": 1.0, "format": 1.0, "partial": 0.0}
    assert reasoning_gym_score(truth, truth, extra) == {"score": 0.0, "lenient": 1.0, "format": 0.0, "partial": 0.0}
    assert reasoning_gym_lenient_score(truth, truth, extra) == 1.0  # for a held-out aux reward
    # wrong: "zebra" contains no task's answer here, so even the tasks' substring credit gives 0
    assert reasoning_gym_score("Answer: zebra", truth, extra) == {
        "score": 0.0, "lenient": 0.0, "format": 1.0, "partial": 0.0}


def test_the_tasks_own_partial_credit_is_the_score_and_is_marked_partial():
    # basic_arithmetic's default scorer: an answer containing the truth gets len(truth)/len(answer)
    row = next(r for r in reasoning_gym_rows("basic_arithmetic", 50, split="test")
               if len(r["reward_model"]["ground_truth"]) == 2 and r["reward_model"]["ground_truth"][0] != "-")
    truth = row["reward_model"]["ground_truth"]
    scored = reasoning_gym_score(f"Answer: {truth}00", truth, row["extra_info"])
    assert scored == {"score": 0.5, "lenient": 0.5, "format": 1.0, "partial": 1.0}  # 2 / 4 characters


def test_a_task_without_one_answer_is_scored_by_its_rule():
    # propositional_logic accepts any valid conclusion: its rows have the ground truth ""
    row = _row("propositional_logic")
    assert row["reward_model"]["ground_truth"] == ""
    example = metadata_from_json(row["extra_info"]["metadata_json"])["example_answer"]
    assert reasoning_gym_score(f"Answer: {example}", "", row["extra_info"])["score"] > 0


def test_metadata_round_trips_tuples_and_sets():
    metadata = {"grid": ((1, 2), (3, 4)), "names": {"b", "a"}, "nested": [{"x": (1,)}], "n": None, 3: "int key"}
    expected = {**{k: v for k, v in metadata.items() if k != 3}, "3": "int key"}  # JSON keys are text
    assert metadata_from_json(metadata_json(metadata)) == expected


def test_every_reasoning_gym_source_resolves_through_one_family_key():
    assert rule_key(RULES, "reasoning_gym/leg_counting") == "reasoning_gym/*"
    assert rule_key(RULES, "arithmetic") == "arithmetic"  # exact names first
    assert rule_key(RULES, "reasoning_gymx") is None and rule_key(RULES, "reasoning_gym") is None
    assert rule_key({"a/*": 1, "a/b/*": 2}, "a/b/c") == "a/b/*"  # the longest family
    assert default_extractors()["reasoning_gym/*"] is final_answer


def test_default_reward_manager_scores_reasoning_gym_rows_and_reports_lenient():
    rows = [_row("leg_counting"), _row("chain_sum")]
    truths = [r["reward_model"]["ground_truth"] for r in rows]
    manager = RewardManager(default_scorers())
    manager.check_sources([r["data_source"] for r in rows])
    out = manager([f"Answer: {truths[0]}", truths[1]], [r["data_source"] for r in rows], truths,
                  [r["extra_info"] for r in rows])
    assert out.scores == [1.0, 0.0] and out.extras["lenient"] == [1.0, 1.0] and out.extras["format"] == [1.0, 0.0]


def test_maj_at_k_votes_on_the_final_answer():
    row = {**_row("leg_counting"), "responses": ["Answer: 1", "x\nAnswer: 2", "Answer: 2 "]}
    result = evaluate_scores([row], [[0.0, 1.0, 1.0]], ks=(3,))["reasoning_gym/leg_counting"]
    assert result.metrics["maj@3/mean"].value == 1.0 and not result.notes  # "2" twice; maj@k not skipped


def test_scorer_errors_name_what_is_missing_and_an_unknown_task_lists_the_valid_ones():
    with pytest.raises(ValueError, match="extra_info lacks question, metadata_json.*rlhf data prepare"):
        reasoning_gym_score("Answer: 1", "1", {"task": "leg_counting"})
    with pytest.raises(ValueError, match=r"no task 'leg_countng'\. Did you mean 'leg_counting'\?.*chain_sum"):
        task_dataset("leg_countng", size=1, seed=0)
    with pytest.raises(ValueError, match="no setting 'bogus'; its settings: min_terms, max_terms"):
        task_dataset("chain_sum", size=1, seed=0, bogus=1)
    with pytest.raises(ValueError, match="invalid settings.*max_terms must be >= min_terms"):
        task_dataset("chain_sum", size=1, seed=0, min_terms=4, max_terms=2)


def test_reasoning_gym_rows_score_the_same_in_reward_worker_processes():
    rows = reasoning_gym_rows("word_sorting", 4, split="test")
    truths = [r["reward_model"]["ground_truth"] for r in rows]
    call = ([f"Answer: {t}" if i % 2 else t for i, t in enumerate(truths)], [r["data_source"] for r in rows], truths,
            [r["extra_info"] for r in rows])
    with RewardManager(default_scorers(), num_workers=1, timeout_s=60) as pooled:  # imports reasoning-gym there
        out = pooled(*call)
    assert out.scores == RewardManager(default_scorers())(*call).scores == [0.0, 1.0, 0.0, 1.0]
    assert out.extras["lenient"] == [1.0] * 4
