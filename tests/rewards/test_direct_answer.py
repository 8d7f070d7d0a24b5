"""The pipeline's gold rule: an answer that names its subject among its first three words scores 1."""

import pytest

from rlhf.data.generators import TOPIC_TEMPLATES, topic_prompt_rows
from rlhf.rewards import default_scorers
from rlhf.rewards.direct_answer import direct_answer_score, subject_position


@pytest.mark.parametrize("response, position, score", [
    ("A comet is a small, icy body.", 1, 1.0),        # "a", "comet": word 1
    ("Comets are icy bodies.", 0, 1.0),               # a word that starts with the subject
    ("Did you know comets have tails?", 3, 0.0),      # word 3: not among the first three (0, 1, 2)
    ("In the vast darkness of space ...", None, 0.0),
    ("", None, 0.0),
    ("COMET: a dirty snowball.", 0, 1.0),             # case and punctuation do not matter
])
def test_hand_computed_scores(response, position, score):
    assert subject_position(response, "comet") == position
    out = direct_answer_score(response, "comet")
    assert out == {"score": score, "position": float(-1 if position is None else position)}


def test_the_window_is_an_option_and_the_rows_data_source_has_it_as_default_rule():
    assert direct_answer_score("Did you know comets have tails?", "comet", words=4)["score"] == 1.0
    assert default_scorers()["direct_answer"] is direct_answer_score


def test_topic_prompts_name_their_subject_and_never_share_a_prompt_across_splits():
    train, test = topic_prompt_rows(), topic_prompt_rows(split="test")
    assert len(test) >= 200 and len(train) > 3 * len(test)  # >= 200 held-out prompts for a gold score
    assert not {r["prompt"][0]["content"] for r in train} & {r["prompt"][0]["content"] for r in test}
    for row in train[:50] + test[:50]:
        topic = row["reward_model"]["ground_truth"]
        assert topic in row["prompt"][0]["content"] and row["data_source"] == "direct_answer"
    assert [r["prompt"] for r in topic_prompt_rows(5, seed=1)] == [r["prompt"] for r in topic_prompt_rows(5, seed=1)]
    assert len({r["prompt"][0]["content"].split()[0] for r in train}) >= len(TOPIC_TEMPLATES) // 2  # varied asks
