"""The user's agent program, and what its return value means.

An agent program is the agent a team already runs, written against the `openai` client and nothing of
ours:

    async def run(task: dict, client: openai.AsyncOpenAI) -> float | dict | None

or a class with that `run` method (one instance per attempt, so an attempt's state is its own), or an
object with it. `task` is the dataset row: `prompt` (its chat messages), `ground_truth`, `extra_info`,
`data_source`, `uid`. `client` talks to a fresh recording-gateway session on the live policy
(rlhf.agent_programs.gateway); the program calls `client.chat.completions.create(...)` as often as it
likes, with `tools=` for function calling, and runs its own tools.

Its return value is the attempt's reward: a number, or a dict with a `reward` entry (and any other
numeric entries, kept in each trajectory's `info` and reported as `info/<key>/{mean,total}`), or None: the reward manager then scores
the final assistant message, as for any rollout. Anything else, or a reward that is not a finite
number, fails the attempt (counted, never the run).
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

AgentFunction = Callable[[dict, Any], Awaitable[Any]]  # async (task, client) -> reward | dict | None


def attempt_function(program: Any) -> Callable[[], AgentFunction]:
    """A factory giving each attempt the coroutine function to call: the program itself, the `run` of an object,
    or the `run` of a fresh instance of a class. Refuses (at graph build time) anything that is not async."""
    if inspect.isclass(program):
        method = getattr(program, "run", None)
        if method is None or not inspect.iscoroutinefunction(method):
            raise TypeError(f"agent program {program.__qualname__}: a class needs `async def run(self, task, client)`")
        return lambda: program().run
    if inspect.iscoroutinefunction(program):
        return lambda: program
    method = getattr(program, "run", None)
    if method is not None and inspect.iscoroutinefunction(method):
        return lambda: method
    name = getattr(program, "__qualname__", type(program).__name__)
    raise TypeError(
        f"agent program {name}: expected `async def run(task, client)` (a coroutine function, or a class or object "
        "with that method); a plain `def` cannot share the event loop its client runs on. Make it `async def` and "
        "use `await client.chat.completions.create(...)`."
    )


@dataclasses.dataclass(frozen=True)
class Outcome:
    """An attempt's reward (None: the reward manager scores it) and the numbers it reported beside it."""

    reward: float | None
    info: dict[str, float] = dataclasses.field(default_factory=dict)


def outcome(value: Any) -> Outcome:
    """What the program returned, as an Outcome; ValueError says what is wrong with anything else."""
    if value is None:
        return Outcome(None)
    if isinstance(value, Mapping):
        info = {}
        for key, item in value.items():
            if key != "reward":
                info[str(key)] = _finite(item, f"returned[{key!r}]")
        reward = value.get("reward")
        return Outcome(None if reward is None else _finite(reward, "returned['reward']"), info)
    return Outcome(_finite(value, "the returned reward"))


def _finite(value: Any, what: str) -> float:
    if isinstance(value, (str, bytes)) or not isinstance(value, (int, float)) and not hasattr(value, "__float__"):
        raise ValueError(f"{what} is {_clip(value)}, not a number (return a float, a dict with 'reward', or None)")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{what} is {number}, not a finite number")
    return number


def _clip(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."
