"""The environment protocol (one instance per rollout) and the tool-use environment most tasks need.

An environment is any object with

    reset(row) -> list of chat messages            the conversation's start, from a dataset row
    step(action) -> StepResult                     what the policy's turn leads to
    close()                                        optional: release what the instance holds

each of which may be `async`. `row` is the dataset row as a dict (`data_source`, `ground_truth`,
`extra_info`, and `raw_prompt`: the prompt's chat messages, from `PromptDataset(raw_prompt=True)`).
The agent loop (rlhf.agents.rollout) makes a fresh instance per rollout from the factory in the
graph (`fdl.Partial(ToolEnvironment, tools=[add])`), runs the instances of one step concurrently
with a timeout, and ends a rollout whose environment raises or hangs without touching the others.

The reward is the environment's (`StepResult.reward`, summed over steps) or the reward
manager's: a trajectory's environment reward reaches the reward manager as
`extra_info["agent"]["reward"]`, which the scorer `environment_reward` returns, so a data
source scored by it takes the environment's reward and any other scorer reads the final answer.
A conversation the environment never rewarded (cut before it reached `step()`) scores
`environment_reward`'s default, 0, and is counted in `agent/no_reward`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol

from rlhf.agents.tools import ERROR_KINDS, Tool, ToolCall, as_tools, run_calls, select_tools
from rlhf.agents.trajectory import Message

Scorer = Callable[[str, Any, Any], float]  # (final answer, ground truth, extra_info) -> reward, as reward scorers


@dataclasses.dataclass(frozen=True)
class Action:
    """One assistant turn as the environment sees it."""

    text: str  # the message as sampled, without the end-of-turn token
    content: str  # its text outside tool calls
    calls: tuple[ToolCall, ...] = ()
    errors: tuple[str, ...] = ()  # malformed calls (the parser's messages)
    turn: int = 1  # 1 for the first assistant turn


@dataclasses.dataclass
class StepResult:
    """What one step returns: messages to show the policy next, a reward, whether the episode ended."""

    messages: list[Message] = dataclasses.field(default_factory=list)
    reward: float | None = None
    done: bool = False
    info: dict[str, float] = dataclasses.field(default_factory=dict)  # counters, summed per rollout (tool_calls, ...)


class Environment(Protocol):
    """reset(row) -> messages; step(action) -> StepResult; either may be a coroutine function."""

    def reset(self, row: Mapping[str, Any]) -> list[Message] | Awaitable[list[Message]]: ...

    def step(self, action: Action) -> StepResult | Awaitable[StepResult]: ...


EnvironmentFactory = Callable[[], Environment]  # a class or fdl.Partial: one call per rollout


NO_REWARD = 0.0  # what `environment_reward` gives a conversation its environment never rewarded


def environment_reward(
    solution_str: str, ground_truth: Any, extra_info: Mapping | None = None, default: float = NO_REWARD
) -> float:
    """The scorer of a data source whose reward the environment gives (RewardManager(scorers={src: environment_reward})).

    A conversation the environment never rewarded scores `default` (0): one whose first turn was cut
    by `max_new_tokens` never reaches `step()`, whatever the environment does, and neither does one
    that ran out of turns before the rewarding step. `agent/no_reward` counts them. Another default:
    `functools.partial(environment_reward, default=-1.0)` (`fdl.Partial` in a graph).
    """
    agent = (extra_info or {}).get("agent")
    if agent is None:
        raise ValueError(
            "environment_reward: this rollout is not a multi-turn one (extra_info['agent'] is missing). It "
            "scores the rollouts of AgentRollout, whose environment returns StepResult(reward=...); score this "
            "data source with an answer scorer instead."
        )
    reward = agent.get("reward")
    return float(default if reward is None else reward)


class ToolEnvironment:
    """Tool use: the row's prompt, its tools, their results as `tool` messages; the episode ends with an answer.

    A turn with tool calls (or malformed ones) gets one `tool` message per call, in order; a turn
    without any is the final answer, scored by `reward` (when given) against the row's ground truth.
    The row may narrow the tools: `extra_info["tools"]` lists the names it allows.
    """

    def __init__(
        self,
        tools: Sequence[Callable[..., Any] | Tool] = (),  # typed functions (schemas from signature and docstring)
        reward: Scorer | None = None,  # scores the final answer; None: the reward manager scores it
        system_prompt: str | None = None,  # prepended as a system message (e.g. how to call the tools)
        tool_timeout_s: float | None = 10.0,  # one call's limit (a hung tool costs only its own result)
    ):
        self.tools = as_tools(tools, tool_timeout_s)
        self.reward = reward
        self.system_prompt = system_prompt
        self.row: Mapping[str, Any] = {}
        self.allowed: dict[str, Tool] = dict(self.tools)

    def reset(self, row: Mapping[str, Any]) -> list[Message]:
        if "raw_prompt" not in row:
            raise KeyError("ToolEnvironment.reset needs the row's chat messages: build the dataset with "
                           "PromptDataset(raw_prompt=True)")
        self.row = row
        extra = row.get("extra_info") or {}
        self.allowed = select_tools(self.tools, extra.get("tools"), where=f"row {row.get('uid', '?')}")
        messages = [dict(m) for m in row["raw_prompt"]]
        if self.system_prompt is not None:
            messages = [{"role": "system", "content": self.system_prompt}] + [
                m for m in messages if m.get("role") != "system"]
        return messages

    def tool_schemas(self) -> list[dict]:
        """The schemas of this row's tools, for chat templates that describe tools themselves (`tools=`)."""
        return [tool.schema for tool in self.allowed.values()]

    async def step(self, action: Action) -> StepResult:
        if not action.calls and not action.errors:
            reward = None
            if self.reward is not None:
                reward = float(self.reward(action.content, self.row.get("ground_truth"), self.row.get("extra_info")))
            return StepResult(reward=reward, done=True)
        results = await run_calls(action.calls, self.allowed)
        messages = [{"role": "tool", "name": r.name, "content": r.content} for r in results]
        messages += [{"role": "tool", "content": f"error: {e}"} for e in action.errors]
        info = {"tool_calls": float(len(results))}
        for kind in ERROR_KINDS:
            count = sum(r.error == kind for r in results)
            if count:
                info[f"tool_errors/{kind}"] = float(count)
        return StepResult(messages, info=info)
