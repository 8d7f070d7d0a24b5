"""experiments/smollm2_arithmetic.py: its reward, written in the recipe, and its prompts (no model needed)."""

import pytest

from helpers import load_file

recipe = load_file("experiments/smollm2_arithmetic.py")


@pytest.mark.parametrize(
    "response, score, partial",
    [
        ("111", 1.0, 0),  # the whole answer is the right number: full credit, not partial
        (" 111\n", 1.0, 0),  # surrounding whitespace is not part of the answer
        ("112", 0.1 + 0.9 * 2 / 3, 1),  # a bare number, wrong: the format's credit, and 2 of 3 digits line up
        ("11", 0.1 + 0.9 * 2 / 3, 1),  # units under units: "11" against "111" matches 2 of 3 places
        ("999", 0.1, 1),  # no digit in its place: still paid for the format
        ("-111", 0.1 + 0.9 * 3 / 4, 1),  # the minus sign is a character that does not match
        ("18 + 93 = 111", 0.5, 1),  # more than the number, but its last number is right
        ("The answer is 111.", 0.5, 1),
        ("111 is the answer to 18 + 93", 0.0, 0),  # the last number is 93
        ("18 + 93 = 112", 0.0, 0),
        ("", 0.0, 0),
        ("one hundred eleven", 0.0, 0),
    ],
)
def test_number_reward(response, score, partial):
    result = recipe.number_reward(response, "111")
    assert result["score"] == pytest.approx(score)
    assert result["partial"] == partial


def test_number_reward_options():
    assert recipe.number_reward("18 + 93 = 111", "111", last_number=0.3)["score"] == 0.3
    assert recipe.number_reward("999", "111", bare_number=0.0) == {"score": 0.0, "partial": 0.0}  # no credit at all


def test_the_partial_share_is_a_metric():
    """Through the recipe's RewardManager: the share of samples paid only partially, per data source."""
    from rlhf.rewards.manager import RewardManager

    out = RewardManager({"arithmetic": recipe.number_reward})(
        ["111", "112", "18 + 93 = 111", "nothing"], ["arithmetic"] * 4, ["111"] * 4, [None] * 4)
    assert out.metrics["reward/extra/arithmetic/partial/mean"] == 0.5  # "112" and the long answer, of 4


def test_the_instruction_follows_each_question():
    rows = [{"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 18+93?"}],
             "data_source": "arithmetic"}]
    (row,) = recipe.ask_for_the_number(rows)
    assert row["prompt"] == [{"role": "system", "content": "Be brief."},
                             {"role": "user", "content": "What is 18+93? Answer with only the number."}]
    assert rows[0]["prompt"][1]["content"] == "What is 18+93?"  # the input rows are left as they were


@pytest.mark.parametrize("mini_batches", [1, 2])
def test_the_lr_schedule_reaches_zero_at_the_last_optimizer_step(mini_batches):
    policy = recipe.base(steps=10, mini_batches=mini_batches).stages["grpo"].policy.worker
    assert policy.training.mini_batches == mini_batches
    assert policy.lr_scheduler.num_training_steps == 10 * mini_batches  # the scheduler steps per optimizer step


@pytest.mark.real_model
def test_prompts_fit_the_prompt_length_the_memory_check_assumes(smollm2_path):
    """The longest question with the instruction and SmolLM2's default system prompt fits MAX_PROMPT_LENGTH
    (a longer prompt would be dropped from the data). Loads the tokenizer only."""
    from rlhf.models.loading import load_tokenizer

    tokenizer = load_tokenizer(smollm2_path)
    (row,) = recipe.ask_for_the_number([{"prompt": [{"role": "user", "content": "What is 100+100?"}]}])
    text = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)
    assert len(tokenizer(text)["input_ids"]) <= recipe.MAX_PROMPT_LENGTH
