"""A misbehaving environment, tool or model turn costs only its own rollout, counted and named in one
line: an environment prompt longer than the prompt limit (as single-turn prompts are filtered), a
1.2 MB prompt, a non-numeric or NaN reward, a non-numeric info value, a tool call nested 1000 deep,
and an environment or tool that raises SystemExit or KeyboardInterrupt (not a timeout)."""

import functools
import importlib.util
import logging
import math
import time
from pathlib import Path

import pytest

from helpers import tiny_model_path
from rlhf.agents import AgentRollout, HermesParser, PythonCallParser, StepResult, ToolEnvironment
from rlhf.data.prompts import PromptDataset
from rlhf.models.loading import load_tokenizer
from rlhf.rollout.hf_engine import HFEngine
from rlhf.rollout.sampling import SamplingParams

_spec = importlib.util.spec_from_file_location("agent_scripted", Path(__file__).parents[1] / "agents" / "scripted.py")
scripted = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(scripted)  # the scripted turns of tests/agents: the real engine's output builder


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first addend
        b: the second addend
    """
    return a + b


def leave(a: int, b: int) -> int:
    """A tool that ends the interpreter.

    Args:
        a: ignored
        b: ignored
    """
    raise SystemExit(3)


class FaultyEnvironment(ToolEnvironment):
    """A tool environment that misbehaves as the row's question says."""

    def reset(self, row):
        self.fault = row["raw_prompt"][0]["content"]
        messages = super().reset(row)
        if self.fault == "long prompt":  # about 860 tokens: over the 512-token prompt limit
            messages = [{"role": "system", "content": "x" * 850}] + messages
        if self.fault == "huge prompt":  # 1.2 MB
            messages = [{"role": "system", "content": "y" * 1_200_000}] + messages
        if self.fault == "reset exits":
            raise SystemExit(2)
        return messages

    async def step(self, action):
        if self.fault == "step interrupts":
            raise KeyboardInterrupt
        result = await super().step(action)
        if self.fault == "text reward":
            result.reward = "three"
        if self.fault == "nan reward":
            result.reward = math.nan
        if self.fault == "text info":
            result.info["tool_calls"] = "one"
        return result


def rollout(faults, parser=PythonCallParser(), tools=(add,), turns=("add(1, 2)", "3"), engine=None, budget=64):
    tok = load_tokenizer(tiny_model_path())
    rows = [{"data_source": "calc", "prompt": [{"role": "user", "content": f}], "reward_model": {"ground_truth": "3"},
             "extra_info": {}} for f in faults]
    prompts = PromptDataset(rows, tok, raw_prompt=True).collate(range(len(rows)))
    generate = engine.generate if engine is not None else \
        scripted.ScriptedPolicy(tok, {f: list(turns) for f in faults}).generate
    agent = AgentRollout(environment=functools.partial(FaultyEnvironment, tools=list(tools)), tokenizer=tok,
                         parser=parser, step_timeout_s=20.0, max_response_tokens=budget)
    started = time.perf_counter()
    batch, metrics = agent.rollout(generate, prompts, SamplingParams(max_new_tokens=min(budget, 16) if engine else budget))
    return batch, metrics, {f: batch["extra_info"][i]["agent"] for i, f in enumerate(faults)}, \
        time.perf_counter() - started


def test_an_environment_prompt_over_the_limit_is_dropped_and_counted_with_a_real_engine():
    batch, metrics, info, _ = rollout(["ok", "long prompt", "huge prompt"], engine=HFEngine(tiny_model_path()))
    assert info["long prompt"]["finish_reason"] == info["huge prompt"]["finish_reason"] == "prompt_too_long"
    assert metrics["agent/prompts_too_long"] == 2 and metrics["agent/finish/prompt_too_long"] == pytest.approx(2 / 3)
    assert "over max_prompt_length=512" in info["long prompt"]["env_error"]
    assert batch["prompts"].shape[1] <= 512  # never handed to the engine or the trainer
    for i in (1, 2):
        assert batch["response_mask"][i].sum() == 0  # not trained on
    assert info["ok"]["finish_reason"] != "prompt_too_long"


@pytest.mark.parametrize("fault, message", [
    ("text reward", "reward 'three' is not a number"),
    ("nan reward", "reward nan is not a finite number"),
    ("text info", "info['tool_calls'] = 'one' is not a number"),
])
def test_a_bad_reward_or_info_value_costs_only_its_rollout(fault, message, caplog):
    with caplog.at_level(logging.WARNING):
        batch, metrics, info, _ = rollout(["ok", fault])
    assert info[fault]["finish_reason"] == "error" and message in info[fault]["env_error"]
    assert batch["response_mask"][1].sum() == 0
    assert info["ok"]["finish_reason"] == "done" and metrics["agent/env_errors"] == 1
    lines = [r.getMessage() for r in caplog.records if message in r.getMessage()]
    assert len(lines) == 1 and "\n" not in lines[0]


def test_a_tool_call_nested_1000_deep_is_a_malformed_call():
    deep = '<tool_call>{"name": "add", "arguments": ' + '{"a": ' * 1000 + "1" + "}" * 1000 + "}</tool_call>"
    batch, metrics, info, _ = rollout(["ok"], parser=HermesParser(), turns=(deep, "3"), budget=20_000)
    assert metrics["tool_errors/parse"] == 1  # the model's observation says so; the rollout goes on
    assert info["ok"]["finish_reason"] == "done"


@pytest.mark.parametrize("fault, message", [
    ("reset exits", "reset: SystemExit: 2"),
    ("step interrupts", "step 1: KeyboardInterrupt"),
])
def test_an_environment_raising_systemexit_or_keyboardinterrupt_is_that_not_a_timeout(fault, message, caplog):
    with caplog.at_level(logging.WARNING):
        batch, metrics, info, seconds = rollout(["ok", fault])
    assert seconds < 10  # not waited out to the 20 s step timeout
    assert info[fault]["finish_reason"] == "error" and message in info[fault]["env_error"]
    assert "no answer within" not in info[fault]["env_error"]
    assert info["ok"]["finish_reason"] == "done" and metrics["agent/env_errors"] == 1
    error = message.split(": ", 1)[1]  # "SystemExit: 2", in the one warning line
    assert len([r for r in caplog.records if error in r.getMessage()]) == 1
    assert not [r for r in caplog.records if r.exc_info]  # no traceback


def test_a_tool_raising_systemexit_is_the_tools_error(caplog):
    with caplog.at_level(logging.WARNING):
        batch, metrics, info, seconds = rollout(["ok"], tools=(leave,), turns=("leave(1, 2)", "3"), budget=256)
    assert seconds < 10 and info["ok"]["finish_reason"] == "done"
    assert metrics["tool_errors/exception"] == 1
    tok = load_tokenizer(tiny_model_path())
    assert "error: leave raised SystemExit: 3" in tok.decode(batch["responses"][0])
