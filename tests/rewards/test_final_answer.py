"""The final answer of a free-form response, the format-blind candidates, and FinalAnswerScorer's dict."""

import pickle

import pytest

from rlhf.rewards import RewardManager, exact_match_score
from hypothesis import given
from hypothesis import strategies as st

from rlhf.rewards.final_answer import (FinalAnswerScorer, LenientScorer, RightAnswerReward, answer_ends_reply,
                                      final_answer, lenient_answers)


@pytest.mark.parametrize(("response", "expected"), [
    ("50*6 = 300\nAnswer: 300", "300"),
    ("Answer: 7", "7"),
    ("answer: 7", "7"),  # any case
    ("ANSWER:7", "7"),
    ("**Answer:** 42", "42"),  # markdown bold, three ways
    ("**Answer: 42**", "42"),
    ("Answer: **42**", "42"),
    ("  Answer: 42  ", "42"),  # indented
    ("Answer: 292.", "292"),  # a full stop after a number ends the sentence
    ("The answer is 2.", "2"),  # the default instruction's form
    ("2 + 75\nThe answer is 2 times 75\nThe answer is 77", "77"),  # the last one, to the end of its line
    ("The answer is **mother-in-law**.", "mother-in-law"),
    ("The answer is Foundation, acute, go.", "Foundation, acute, go"),
    ("So the final answer is: 3.14.", "3.14"),
    ("I think the answer is", None),  # a marker with nothing after it counts as absent
    ("The answer is 6\nAnswer: 5", "5"),  # an "Answer:" line comes first
    ("Answer: 3.5", "3.5"),
    ("Answer: 1, 2, 3", "1, 2, 3"),
    ("Answer: `b, a`", "b, a"),
    ("Answer: 1\nthen again\nAnswer: 2", "2"),  # the LAST one
    ("Answer:\n1 0\n0 1", "1 0\n0 1"),  # a grid on the lines after it
    ("Answer: 12<|im_end|>", "12"),  # end-of-turn markers dropped
    ("The Answer: 5", None),  # not at the start of a line
    ("My answer: 5", None),
    ("Answer:", None),  # nothing after it
    ("so \\boxed{18}", "18"),  # no "Answer:": the last \boxed{}
    ("\\boxed{1} or \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
    ("\\boxed{3}\nAnswer: 4", "4"),  # "Answer:" wins over \boxed
    ("The answer is 300", "300"),  # the sentence form, without a full stop too
    # quotes around the whole answer (the instruction quotes its sentence, and SmolLM2 quotes the answer)
    ('The answer is "No"', "No"),
    ('The answer is "No".', "No"),
    ('The answer is "No."', "No"),
    ("The answer is 'dog'.", "dog"),
    ("The answer is \u201cdog\u201d.", "dog"),  # curly quotes
    ('The answer is **"42"**.', "42"),
    ('Answer: "b, a"', "b, a"),
    ('The answer is "a" and "b".', '"a" and "b"'),  # two quoted parts: not one quoted answer, kept whole
    ('The answer is "No" to both statements.', '"No" to both statements'),  # not the whole of it
    ("The answer is it's'", "it's'"),  # no pair around the whole
    ('The answer is "".', '""'),  # nothing inside: kept as written
    ("", None),
])
def test_final_answer(response, expected):
    assert final_answer(response) == expected


@pytest.mark.parametrize(("response", "expected"), [
    ("Answer: 300", ["300", "Answer: 300"]),  # the final answer, the last line (the number repeats: dropped)
    ("50*6 = 300", ["50*6 = 300", "300"]),  # last line, last number
    ("I think\nthe total is 1,234.", ["the total is 1,234", "1234"]),  # full stop and commas out
    ("Answer: b, a\n", ["b, a", "Answer: b, a"]),
    ("It is -7 degrees", ["It is -7 degrees", "-7"]),
    ("no digits here", ["no digits here"]),
    ("   \n  ", []),
])
def test_lenient_answers(response, expected):
    assert lenient_answers(response) == expected


@pytest.mark.parametrize(("response", "expected"), [
    ("Answer: 42", {"score": 1.0, "lenient": 1.0, "format": 1.0, "partial": 0.0}),
    ("6*7 = 42\nAnswer: 42", {"score": 1.0, "lenient": 1.0, "format": 1.0, "partial": 0.0}),
    ("42", {"score": 0.0, "lenient": 1.0, "format": 0.0, "partial": 0.0}),  # right, format ignored
    ("6*7 = 42", {"score": 0.0, "lenient": 1.0, "format": 0.0, "partial": 0.0}),
    ("Answer: 41", {"score": 0.0, "lenient": 0.0, "format": 1.0, "partial": 0.0}),  # format right, answer wrong
    ("6*7 = 42\nAnswer: 41", {"score": 0.0, "lenient": 0.0, "format": 1.0, "partial": 0.0}),  # 42 is no candidate
    ("no idea", {"score": 0.0, "lenient": 0.0, "format": 0.0, "partial": 0.0}),
])
def test_final_answer_scorer_scores_exact_match_through_the_answer_line(response, expected):
    assert FinalAnswerScorer(exact_match_score)(response, "42", None) == expected


def test_final_answer_scorer_marks_partial_credit_and_reads_dict_scores():
    def half(answer, truth, extra):  # a partial-credit scorer returning dicts
        return {"score": 1.0 if answer == truth else 0.5 if truth in answer else 0.0}

    scorer = FinalAnswerScorer(half)
    assert scorer("Answer: 142", "42") == {"score": 0.5, "lenient": 0.5, "format": 1.0, "partial": 1.0}
    # lenient: the candidates "142" and "Answer: 142" score a half each; "x 42" has the whole truth in its number
    assert scorer("x 42", "42") == {"score": 0.0, "lenient": 1.0, "format": 0.0, "partial": 0.0}
    with pytest.raises(TypeError, match="scorer of answers"):
        FinalAnswerScorer("exact")


def test_final_answer_scorer_in_a_reward_manager_pickles_and_reports_its_extras():
    scorer = FinalAnswerScorer(exact_match_score)
    assert pickle.loads(pickle.dumps(scorer)) == scorer  # sent to reward worker processes and Ray workers
    out = RewardManager({"arithmetic": scorer})(["Answer: 42", "42", "Answer: 41"], ["arithmetic"] * 3,
                                               ["42"] * 3, [None] * 3)
    assert out.scores == [1.0, 0.0, 0.0]
    assert out.extras == {"lenient": [1.0, 1.0, 0.0], "format": [1.0, 0.0, 1.0], "partial": [0.0, 0.0, 0.0]}


def test_lenient_scorer_scores_the_lenient_value_for_an_aux_reward():
    lenient = LenientScorer(exact_match_score)
    assert [lenient(r, "42") for r in ("Answer: 42", "6*7 = 42", "Answer: 41", "no")] == [1.0, 1.0, 0.0, 0.0]
    assert pickle.loads(pickle.dumps(lenient)) == lenient
    out = RewardManager({"arithmetic": lenient})(["42", "Answer: 41"], ["arithmetic"] * 2, ["42"] * 2, [None] * 2)
    assert out.scores == [1.0, 0.0] and out.extras == {}


# RightAnswerReward: credit only for right answers; the form earns more than no form; a wrong answer earns 0.
@pytest.mark.parametrize("response, reward, partial", [
    ("Answer: 111", 1.0, 0.0),                          # right, in the form
    ("18 + 93 = 111", 0.1, 1.0),                        # right, no form: the unformatted credit (partial)
    ("The sum is 111.\nAnswer: 111", 1.0, 0.0),
    ("Answer: 112", 0.0, 0.0),                          # wrong in the form: nothing for looking right
    ("18 + 93 = 112", 0.0, 0.0),                        # wrong without it
    ("Answer: 112\n", 0.0, 0.0),
    ("111\nAnswer: 112", 0.0, 0.0),                     # the form is read first: a right guess before it earns nothing
    ("", 0.0, 0.0),
])
def test_right_answer_reward_pays_only_for_right_answers(response, reward, partial):
    judged = RightAnswerReward(FinalAnswerScorer(exact_match_score))(response, "111")
    assert (judged["score"], judged["partial"]) == (reward, partial)
    assert judged["strict"] == (1.0 if reward == 1.0 else 0.0)


@given(st.text(max_size=40), st.floats(0.0, 0.99))
def test_right_answer_reward_never_exceeds_strict_unless_right_and_never_pays_a_wrong_answer(response, credit):
    reward = RightAnswerReward(FinalAnswerScorer(exact_match_score), unformatted_credit=credit)
    judged = reward(response, "42")
    assert judged["score"] <= max(judged["strict"], credit * judged["lenient"])
    if judged["lenient"] == 0.0:
        assert judged["score"] == 0.0
    if judged["format"] == 1.0:
        assert judged["score"] == judged["strict"]


def test_right_answer_reward_refuses_a_credit_that_would_rank_no_form_above_the_form():
    with pytest.raises(ValueError, match=r"unformatted_credit must be in \[0, 1\)"):
        RightAnswerReward(FinalAnswerScorer(exact_match_score), unformatted_credit=1.0)
    with pytest.raises(ValueError, match="without"):
        RightAnswerReward(exact_match_score)("Answer: 1", "1")


@pytest.mark.parametrize(("response", "ends"), [
    ("The answer is 2.", True),
    ("6 * 7 = 42\nThe answer is 42.\n", True),                 # reasoning first, answer last
    ("The answer is 42.<|im_end|>", True),                     # end-of-turn markers are not text
    ("The answer is 1.\nThe answer is 1.", True),              # said twice, still last
    ("The answer is 13.\n\nHere is the breakdown: 6 + 7", False),  # a justification after the answer
    ("The answer is 2.\n\nThis is a Python function:\n```", False),
    ("The answer is 2.\nThe answer is 1.\n\nTry again.", False),
    ("The answer is 5. I hope it helps.", True),               # on its line: the answer read is "5. I hope it helps"
    ("Answer: 42", True),                                      # an "Answer:" line runs to the end
    ("Answer:\n1 0\n0 1", True),
    ("so \\boxed{18}", True),
    ("\\boxed{18}\nwhich is the total", False),
    ("42", False),                                             # no final answer at all
    ("I think the answer is", False),
    ("", False),
])
def test_answer_ends_reply(response, ends):
    assert answer_ends_reply(response) is ends


@pytest.mark.parametrize(("response", "reward", "partial"), [
    ("The answer is 111.", 1.0, 0.0),
    ("18 + 93 = 111\nThe answer is 111.", 1.0, 0.0),
    ("The answer is 111.\nThe answer is 111.", 1.0, 0.0),
    ("The answer is 111.\n\nBecause 18 + 93 = 111.", 0.1, 1.0),  # right, then kept writing: the unformatted credit
    ("The answer is 112.\n\nBecause 18 + 93 = 111.", 0.0, 0.0),  # the form is read first: wrong earns nothing
    ("18 + 93 = 111", 0.1, 1.0),                                  # no form: as without answer_last
    ("The answer is 112.", 0.0, 0.0),
])
def test_right_answer_reward_with_answer_last_pays_in_full_only_a_reply_that_ends_with_its_answer(response, reward,
                                                                                                   partial):
    judged = RightAnswerReward(FinalAnswerScorer(exact_match_score), answer_last=True)(response, "111")
    assert (judged["score"], judged["partial"]) == (reward, partial)
    assert judged["answer_last"] == (1.0 if answer_ends_reply(response) else 0.0)
    without = RightAnswerReward(FinalAnswerScorer(exact_match_score))(response, "111")
    assert without["score"] >= judged["score"]  # answer_last only ever takes credit away


@given(st.text(max_size=40), st.floats(0.0, 0.99))
def test_right_answer_reward_with_answer_last_pays_in_full_only_right_replies_ending_with_their_answer(response,
                                                                                                       credit):
    judged = RightAnswerReward(FinalAnswerScorer(exact_match_score), unformatted_credit=credit,
                               answer_last=True)(response, "42")
    if judged["score"] == 1.0:
        assert judged["strict"] == 1.0 and answer_ends_reply(response)
    assert judged["score"] in (0.0, credit, 1.0)


def test_right_answer_reward_compares_and_pickles_with_answer_last():
    reward = RightAnswerReward(FinalAnswerScorer(exact_match_score), answer_last=True)
    assert pickle.loads(pickle.dumps(reward)) == reward
    assert reward != RightAnswerReward(FinalAnswerScorer(exact_match_score))


def _contains_truth(answer, truth, extra_info=None):
    """A scorer with reasoning-gym's kind of partial credit: len(truth)/len(answer) for an answer containing it."""
    return 1.0 if answer == truth else len(truth) / len(answer) if truth in answer else 0.0


@pytest.mark.parametrize("response, reward, task_partial", [
    ("The answer is 1.", 1.0, 0.0),
    ("The answer is 18.", 0.0, 1.0),   # the task would pay 0.5 for "18" where the truth is 1: not paid
    ("It is 18", 0.0, 0.0),            # no form, and "18" is not right format aside either
    ("It is 1", 0.1, 0.0),             # right without the form
])
def test_right_answer_reward_does_not_pay_a_tasks_partial_credit(response, reward, task_partial):
    judged = RightAnswerReward(FinalAnswerScorer(_contains_truth))(response, "1")
    assert (judged["score"], judged["task_partial"]) == (reward, task_partial)
    assert judged["lenient"] in (0.0, 1.0)


def test_correct_counts_full_credit_only():
    from rlhf.rewards.final_answer import Correct

    correct = Correct(FinalAnswerScorer(_contains_truth))
    assert [correct(r, "1") for r in ("The answer is 1.", "The answer is 18.", "1")] == [1.0, 0.0, 0.0]
    assert Correct(LenientScorer(_contains_truth))("so 1", "1") == 1.0 and Correct(_contains_truth)("18", "1") == 0.0
