"""SFT demonstrations of tool use: chat rows whose tool results come from running the real tools.

A tiny or untuned model rarely calls a tool unprompted, so RL starts from a short SFT on rows like

    user: What is 4821+7390?
    assistant: add(4821, 7390)          <- `parser.format` of the calls that solve the row
    tool: 12211                          <- the tool's own answer
    assistant: 12211                     <- the row's ground truth

(`SFTDataset` trains the assistant turns only.) The calls come in the parser's format, so the
policy learns exactly what the agent loop will parse.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rlhf.agents.parsers import ToolCallParser
from rlhf.agents.tools import Tool, ToolCall, as_tools, run_calls


def tool_demonstrations(
    rows: Sequence[Mapping],  # verl prompt rows (prompt messages, reward_model.ground_truth)
    calls: Callable[[Mapping], list[ToolCall]],  # the calls that solve a row
    tools: Sequence[Callable[..., Any] | Tool],
    parser: ToolCallParser,
    system_prompt: str | None = None,  # the environment's (ToolEnvironment(system_prompt=...)), so SFT sees its prompts
    # OpenAI function schemas put in each row as `tools` (the chat template renders them, as for an agent's request
    # with `tools=`: give an agent program's own list); None: the row has none
    tool_schemas: Sequence[Mapping] | None = None,
) -> list[dict]:
    """One `messages` row per prompt row: prompt, assistant calls, tool results, the ground truth as the answer."""
    by_name = as_tools(tools)
    out = []
    for row in rows:
        wanted = calls(row)
        results = asyncio.run(run_calls(wanted, by_name))
        failed = [r for r in results if r.error]
        if failed:
            raise ValueError(f"tool_demonstrations: the demonstration calls of row {row.get('extra_info')} failed: "
                             f"{failed[0].content}")
        messages = [dict(m) for m in row["prompt"]]
        if system_prompt is not None:
            messages = [{"role": "system", "content": system_prompt}] + [m for m in messages if m["role"] != "system"]
        messages.append({"role": "assistant", "content": parser.format(wanted)})
        messages += [{"role": "tool", "name": r.name, "content": r.content} for r in results]
        messages.append({"role": "assistant", "content": str(row["reward_model"]["ground_truth"])})
        out.append({"data_source": row.get("data_source"), "messages": messages,
                    **({"tools": [dict(t) for t in tool_schemas]} if tool_schemas else {})})
    return out
