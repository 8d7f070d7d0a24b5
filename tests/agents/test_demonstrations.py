"""SFT demonstrations of tool use: tool results from the real tools, and the same token ids and loss mask as
the agent loop builds for the same conversation (what SFT teaches is what RL then samples from)."""

import functools

import pytest

from rlhf.agents import AgentRollout, CodeBlockParser, PythonCallParser, ToolEnvironment
from rlhf.agents.demonstrations import tool_demonstrations
from rlhf.agents.library import add, addition_calls, addition_code_calls, python
from rlhf.data.generators import long_addition_rows
from rlhf.data.prompts import PromptDataset
from rlhf.data.sft import SFTDataset
from rlhf.rollout.sampling import SamplingParams
from scripted import ScriptedPolicy
from chat_templates import SMOLLM2_TEMPLATE
from test_trajectory import tokenizer


@pytest.mark.parametrize("template, tool, calls, parser, system", [
    (None, add, addition_calls, PythonCallParser(), None),
    (SMOLLM2_TEMPLATE, python, addition_code_calls, CodeBlockParser(), "Use Python."),
], ids=["chatml-calculator", "smollm2-python"])
def test_sft_demonstrations_match_the_agent_loop_token_for_token(template, tool, calls, parser, system):
    tok = tokenizer(template)
    rows = long_addition_rows(2, digits=4, seed=3)
    demos = tool_demonstrations(rows, calls, [tool], parser, system_prompt=system)
    a, b = rows[0]["extra_info"]["a"], rows[0]["extra_info"]["b"]
    assert [m["role"] for m in demos[0]["messages"]] == ["system"] * bool(system) + ["user", "assistant", "tool",
                                                                                        "assistant"]
    assert demos[0]["messages"][-2]["content"] == str(a + b)  # the tool's own answer
    sft = SFTDataset(demos, tok).collate([0, 1])
    agent = AgentRollout(environment=functools.partial(ToolEnvironment, tools=[tool], system_prompt=system),
                         tokenizer=tok, parser=parser, max_response_tokens=512)
    scripts = {r["prompt"][0]["content"]: [d["messages"][-3]["content"], d["messages"][-1]["content"]]
               for r, d in zip(rows, demos)}
    batch, _ = agent.rollout(ScriptedPolicy(tok, scripts).generate, PromptDataset(rows, tok, raw_prompt=True)
                             .collate([0, 1]), SamplingParams(max_new_tokens=64))
    for i in range(2):
        assert _ids(sft, i) == _ids(batch, i)
        assert sft["response_mask"][i][: len(_ids(sft, i)) - _prompt(sft, i)].tolist() == \
            batch["response_mask"][i][: len(_ids(batch, i)) - _prompt(batch, i)].tolist()


def _prompt(batch, i) -> int:
    return int(batch["attention_mask"][i, : batch["input_ids"].shape[1] - batch["responses"].shape[1]].sum())


def _ids(batch, i) -> list[int]:
    return batch["input_ids"][i][batch["attention_mask"][i].bool()].tolist()
