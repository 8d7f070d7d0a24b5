"""SFT demonstrations of tool use: chat rows whose tool results come from running the real tools.

A tiny or untuned model rarely calls a tool unprompted, so RL starts from a short SFT on rows like

    user: What is 4821+7390?
    assistant: add(4821, 7390)          <- `parser.format` of the calls that solve the row
    tool: 12211                          <- the tool's own answer
    assistant: 12211                     <- the row's ground truth

(`SFTDataset` trains the assistant turns only.) The calls come in the parser's format, so the
policy learns exactly what the agent loop will parse.

A multi-step chain (look something up, then compute with it) is a list of steps, each one
assistant turn of calls followed by their results:

    calls(row) -> [[ToolCall("lookup", {"city": "Paris"})], [ToolCall("add", {}, (2161000, 1000))]]

A step may also depend on what the earlier ones returned: `calls` may then be a generator that
receives each step's results (`results = yield [ToolCall(...)]`, a list of `ToolResult`).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Generator, Mapping, Sequence
from typing import Any

from rlhf.agents.parsers import ToolCallParser
from rlhf.agents.tools import Tool, ToolCall, ToolResult, as_tools, run_calls

Steps = list[ToolCall] | list[list[ToolCall]] | Generator[list[ToolCall], list[ToolResult], None]


def tool_demonstrations(
    rows: Sequence[Mapping],  # verl prompt rows (prompt messages, reward_model.ground_truth)
    calls: Callable[[Mapping], Steps],  # the calls that solve a row: one turn's, a list of steps, or a generator
    tools: Sequence[Callable[..., Any] | Tool],
    parser: ToolCallParser,
    system_prompt: str | None = None,  # the environment's (ToolEnvironment(system_prompt=...)), so SFT sees its prompts
    # OpenAI function schemas put in each row as `tools` (the chat template renders them, as for an agent's request
    # with `tools=`: give an agent program's own list); None: the row has none
    tool_schemas: Sequence[Mapping] | None = None,
) -> list[dict]:
    """One `messages` row per prompt row: prompt, then per step the assistant's calls and the tool results,
    then the ground truth as the answer."""
    by_name = as_tools(tools)
    out = []
    for row in rows:
        messages = [dict(m) for m in row["prompt"]]
        if system_prompt is not None:
            messages = [{"role": "system", "content": system_prompt}] + [m for m in messages if m["role"] != "system"]
        for step in _steps(calls(row), by_name, row):
            wanted, results = step
            messages.append({"role": "assistant", "content": parser.format(wanted)})
            messages += [{"role": "tool", "name": r.name, "content": r.content} for r in results]
        messages.append({"role": "assistant", "content": str(row["reward_model"]["ground_truth"])})
        out.append({"data_source": row.get("data_source"), "messages": messages,
                    **({"tools": [dict(t) for t in tool_schemas]} if tool_schemas else {})})
    return out


def _steps(planned: Steps, tools: Mapping[str, Tool], row: Mapping):
    """(calls, results) of each step, the calls run for real; a failed call is an error naming the row."""
    if not inspect.isgenerator(planned):
        planned = list(planned)
        planned = iter([planned] if planned and isinstance(planned[0], ToolCall) else planned)
    send = getattr(planned, "send", None)  # a generator is told each step's results
    wanted = next(planned, None)
    while wanted:
        wanted = list(wanted)
        results = asyncio.run(run_calls(wanted, tools))
        failed = [r for r in results if r.error]
        if failed:
            raise ValueError(f"tool_demonstrations: the demonstration calls of row {row.get('extra_info')} failed: "
                             f"{failed[0].content}")
        yield wanted, results
        try:
            wanted = send(results) if send is not None else next(planned)
        except StopIteration:
            wanted = None
