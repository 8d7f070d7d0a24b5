"""Defects found when the agent API was used as an outside user would (issue 34, item 7), each pinned: the
documented example scored by `environment_reward`, records with null rewards or longer than the context,
per-turn temperatures, custom info counters, templates that ignore `tools=`, multi-step demonstrations."""

import functools
import logging
import random

import pytest
import torch

from helpers import tiny_model_path
from rlhf.agents import Action, AgentRollout, PythonCallParser, StepResult, ToolEnvironment, Trajectory, \
    environment_reward, trajectory_batch
from rlhf.agents.demonstrations import tool_demonstrations
from rlhf.agents.tools import ToolCall
from rlhf.batch import Batch
from rlhf.data.prompts import PromptDataset
from rlhf.rewards.manager import RewardManager
from rlhf.rollout.hf_engine import HFEngine
from rlhf.rollout.sampling import SamplingParams
from rlhf.trainers.scoring import score_rollout
from scripted import ScriptedPolicy
from test_trajectory import add, tokenizer


class GuessTheNumber:
    """docs/agents.md's complete environment, as documented."""

    def reset(self, row):
        self.secret = random.Random(row["extra_info"]["seed"]).randint(1, 100)
        return [{"role": "user", "content": "Guess my number (1-100). Answer with the number only."}]

    async def step(self, action: Action) -> StepResult:
        try:
            guess = int(action.content.strip())
        except ValueError:
            return StepResult([{"role": "user", "content": "A number, please."}], reward=-0.1)
        if guess == self.secret:
            return StepResult(reward=1.0, done=True)
        hint = "higher" if guess < self.secret else "lower"
        return StepResult([{"role": "user", "content": hint}])


def rows_for(tok, questions, **extra):
    rows = [{"data_source": "game", "prompt": [{"role": "user", "content": q}], "reward_model": {"ground_truth": "0"},
             "extra_info": {"seed": i, **extra}} for i, q in enumerate(questions)]
    return PromptDataset(rows, tok, raw_prompt=True).collate(range(len(rows)))


def test_guess_the_number_cut_before_its_first_step_scores_the_default_not_a_scorer_error():
    """The tiny model's first turns are cut by max_new_tokens (it almost never samples EOS), so no conversation
    reaches step(); scored by `environment_reward`, each gets its default 0, counted, instead of ScorerError."""
    torch.manual_seed(0)  # sampled: the outcome must not depend on which tests ran before
    engine = HFEngine(tiny_model_path())
    agent = AgentRollout(environment=GuessTheNumber, tokenizer=engine.tokenizer, max_turns=7)
    batch, metrics = agent.rollout(engine.generate, rows_for(engine.tokenizer, ["go"] * 4),
                                   SamplingParams(temperature=1.0, max_new_tokens=3))
    scored, _ = score_rollout(batch, engine.tokenizer, RewardManager(scorers={"game": environment_reward}))
    assert scored["scores"].tolist() == [0.0] * 4
    assert metrics["agent/finish/length"] == 1.0 and metrics["agent/no_reward"] == 4
    minus_one = functools.partial(environment_reward, default=-1.0)
    scored, _ = score_rollout(batch, engine.tokenizer, RewardManager(scorers={"game": minus_one}))
    assert scored["scores"].tolist() == [-1.0] * 4


def _record(**changes) -> dict:
    record = {"prompt_ids": [1, 2], "response_ids": [3, 4], "loss_mask": [1, 1], "log_probs": [-0.5, -0.25],
              "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}],
              "turns": [[0, 2]], "rewards": [1.0], "max_response_tokens": 8}
    return {**record, **changes}


@pytest.mark.parametrize("field, value", [("rewards", [None]), ("rewards", [float("nan")]),
                                          ("log_probs", [None, 0.0]), ("response_ids", [3, None])])
def test_a_record_with_a_null_or_non_finite_value_is_refused_with_the_field_named(field, value):
    with pytest.raises(ValueError, match=rf"{field}\[\d\] is (None|nan)"):
        Trajectory.from_dict(_record(**{field: value}))
    assert Trajectory.from_dict(_record()).rewards == [1.0]


def test_trajectory_batch_refuses_a_trajectory_longer_than_the_context():
    rows = Batch({}, {"uid": ["a"], "extra_info": [{}]})
    long = Trajectory.from_dict(_record(prompt_ids=[1] * 400, response_ids=[3] * 255, loss_mask=[1] * 255,
                                        log_probs=[-0.1] * 255, max_response_tokens=1 << 20))  # 655 ids
    with pytest.raises(ValueError, match="trajectory 0 has 400 prompt \\+ 255 response tokens, over the context "
                                         "of 512"):
        trajectory_batch([long], rows, 0, 1.0, 256, max_model_len=512)
    with pytest.raises(ValueError, match="over its own max_response_tokens=8"):
        trajectory_batch([Trajectory.from_dict(_record(response_ids=[3] * 9, loss_mask=[1] * 9,
                                                       log_probs=[0.0] * 9))], rows, 0, 1.0, 256)


def test_trajectory_batch_takes_the_recorded_per_turn_temperatures():
    """Two turns at 0.7 and one at 1.0: without a temperature the batch refuses (naming where); at 0.7 the
    1.0 turn is kept out of the loss (its log-probs belong to another distribution) and counted."""
    t = Trajectory.from_dict(_record(response_ids=[3, 4, 5, 6, 7, 8], loss_mask=[1, 1, 0, 1, 0, 1],
                                     log_probs=[-0.1, -0.2, 0.0, -0.3, 0.0, -0.4], turns=[[0, 2], [3, 4], [5, 6]],
                                     temperatures=[0.7, 1.0, 0.7]))
    same = Trajectory.from_dict(_record(temperatures=[0.7]))
    rows = Batch({}, {"uid": ["a", "b"], "extra_info": [{}, {}]})
    batch = trajectory_batch([same, same], rows, 0, None, 16)
    assert batch.meta["temperature"] == 0.7
    with pytest.raises(ValueError, match=r"several temperatures \(0.7 \(trajectory 0 turn 1\), 1 \(trajectory 0 "
                                         r"turn 2\)\)"):
        trajectory_batch([t, same], rows, 0, None, 16)
    batch = trajectory_batch([t, same], rows, 0, 0.7, 16)
    assert batch["response_mask"][0].tolist() == [1, 1, 0, 0, 0, 1]
    assert batch["rollout_log_probs"][0, 3] == 0 and batch["extra_info"][0]["agent"]["off_temperature_turns"] == 1
    assert "off_temperature_turns" not in batch["extra_info"][1]["agent"]
    assert t.loss_mask == [1, 1, 0, 1, 0, 1]  # the trajectory itself is left as recorded


class Hinting:
    """Counts its hints in a custom info counter; two turns."""

    def reset(self, row):
        return list(row["raw_prompt"])

    def step(self, action):
        return StepResult([{"role": "user", "content": "hint"}], info={"hints": 2.0, "tool_calls": 0.0},
                          done=action.turn == 2)


def test_custom_step_info_counters_reach_the_metrics():
    tok = tokenizer()
    agent = AgentRollout(environment=Hinting, tokenizer=tok, parser=PythonCallParser())
    policy = ScriptedPolicy(tok, {"q0": ["a", "b"], "q1": ["a", "b"]})
    _, metrics = agent.rollout(policy.generate, rows_for(tok, ["q0", "q1"]), SamplingParams(max_new_tokens=8))
    assert metrics["info/hints/mean"] == 4.0 and metrics["info/hints/total"] == 8.0  # 2 per step, 2 steps each
    assert not any(k.startswith("info/tool_calls") for k in metrics)  # built-in counters keep their own names


def test_the_agent_loop_warns_once_when_the_chat_template_ignores_tools(caplog):
    """The tiny model's ChatML template never writes `tools`: `rlhf serve` refuses such requests with a 400, the
    agent loop (which has no client to answer) warns, once per producer."""
    tok = tokenizer()
    agent = AgentRollout(environment=functools.partial(ToolEnvironment, tools=[add]), tokenizer=tok,
                         parser=PythonCallParser())
    policy = ScriptedPolicy(tok, {"1+2": ["3"], "2+2": ["4"]})
    with caplog.at_level(logging.WARNING, logger="rlhf.agents.rollout"):
        for _ in range(2):
            agent.rollout(policy.generate, rows_for(tok, ["What is 1+2?", "What is 2+2?"]),
                          SamplingParams(max_new_tokens=8))
    warnings = [r.getMessage() for r in caplog.records if "ignores `tools`" in r.getMessage()]
    assert len(warnings) == 1 and "(add)" in warnings[0]


def mul(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: the first factor
        b: the second factor
    """
    return a * b


def test_tool_demonstrations_express_a_multi_step_chain():
    """(a + b) * c in two steps: as a list of steps, and as a generator whose second call uses the first's result."""
    rows = [{"data_source": "chain", "prompt": [{"role": "user", "content": "(2+3)*4?"}],
             "reward_model": {"ground_truth": "20"}, "extra_info": {"a": 2, "b": 3, "c": 4}}]

    def listed(row):
        x = row["extra_info"]
        return [[ToolCall("add", {}, (x["a"], x["b"]))], [ToolCall("mul", {}, (x["a"] + x["b"], x["c"]))]]

    def chained(row):
        x = row["extra_info"]
        (total,) = yield [ToolCall("add", {}, (x["a"], x["b"]))]
        yield [ToolCall("mul", {}, (int(total.content), x["c"]))]

    for calls in (listed, chained):
        (demo,) = tool_demonstrations(rows, calls, [add, mul], PythonCallParser())
        assert [(m["role"], m["content"]) for m in demo["messages"]] == [
            ("user", "(2+3)*4?"), ("assistant", "add(2, 3)"), ("tool", "5"), ("assistant", "mul(5, 4)"),
            ("tool", "20"), ("assistant", "20")]
