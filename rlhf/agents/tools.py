"""Tools: typed Python functions the policy may call, with an OpenAI-style schema from the signature.

A tool is a plain function (sync or `async`) with type hints and a Google-style docstring:

    def add(a: int, b: int) -> int:
        '''Add two integers exactly.

        Args:
            a: the first addend
            b: the second addend
        '''
        return a + b

`Tool(add).schema` is the JSON schema chat templates take as `tools=` (transformers'
`get_json_schema` reads the signature and the docstring), and `Tool.call` validates the model's
arguments against the hints (pydantic, lax: "12" becomes 12) before running the function.
Whatever goes wrong in a call (unknown tool, bad arguments, an exception, a timeout) comes back
as an error `ToolResult` whose text tells the model what happened; nothing is raised, so a
broken tool costs the rollout that called it, never the run.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import json
import threading
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pydantic
from transformers.utils import get_json_schema

ERROR_KINDS = ("parse", "unknown_tool", "invalid_arguments", "exception", "timeout")
"""Why a tool call failed: the `tool_errors/<kind>` metrics."""


@dataclasses.dataclass(frozen=True)
class ToolCall:
    """One call the policy asked for: keyword `arguments` (JSON formats) and/or `positional` ones (Python calls)."""

    name: str
    arguments: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    positional: tuple[Any, ...] = ()


@dataclasses.dataclass(frozen=True)
class ToolResult:
    """What a call returned, as the text the tool message carries; `error` names the failure kind."""

    name: str
    content: str
    error: str | None = None  # one of ERROR_KINDS, or None when the call succeeded


class Tool:
    """A typed function made callable by the policy; `timeout_s` bounds one call (None: no limit)."""

    def __init__(self, fn: Callable[..., Any], timeout_s: float | None = 10.0):
        if isinstance(fn, Tool):
            fn = fn.fn
        try:
            self.schema = get_json_schema(fn)
        except Exception as err:  # transformers' DocstringParsingException / TypeHintParsingException
            raise ValueError(
                f"tool {getattr(fn, '__name__', fn)!r}: its schema comes from the signature and docstring, which "
                f"could not be read ({err}). Give every parameter a type hint and describe it under `Args:` in a "
                "Google-style docstring."
            ) from None
        self.fn = fn
        self.name = fn.__name__
        self.timeout_s = timeout_s
        self.signature = inspect.signature(fn)
        self.is_async = inspect.iscoroutinefunction(fn)
        self._arguments = _arguments_model(fn, self.signature)

    def __repr__(self) -> str:
        return f"Tool({self.name})"

    async def call(self, call: ToolCall) -> ToolResult:
        """Run one call: arguments bound and validated, then the function, within `timeout_s`."""
        try:
            bound = self.signature.bind(*call.positional, **dict(call.arguments))
        except TypeError as err:
            return ToolResult(self.name, f"error: {self.name}{self.signature}: {err}", "invalid_arguments")
        args, kwargs = bound.args, bound.kwargs
        try:
            if self._arguments is not None:  # checked and coerced first: the call itself runs outside pydantic
                kwargs = dict(self._arguments.model_validate(bound.arguments))
                args = ()
            work = self.fn(*args, **kwargs) if self.is_async else in_daemon_thread(self.fn, *args, **kwargs)
            value = await asyncio.wait_for(work, self.timeout_s)
        except pydantic.ValidationError as err:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {e['msg']}" for e in err.errors())
            return ToolResult(self.name, f"error: invalid arguments for {self.name}: {problems}", "invalid_arguments")
        except TimeoutError:
            return ToolResult(self.name, f"error: {self.name} timed out after {self.timeout_s:g} s", "timeout")
        except (Exception, SystemExit, KeyboardInterrupt) as err:  # the tool's own failure is the model's observation
            # SystemExit / KeyboardInterrupt here are the tool's own (signals reach the main thread, not this one)
            return ToolResult(self.name, f"error: {self.name} raised {type(err).__name__}: {err}", "exception")
        return ToolResult(self.name, value if isinstance(value, str) else json.dumps(value, default=str))


def _arguments_model(fn: Callable[..., Any], signature: inspect.Signature) -> type[pydantic.BaseModel] | None:
    """A pydantic model of `fn`'s parameters (lax: "12" is an int), or None when some are positional-only or
    variadic (those calls are not checked).

    Validation happens before the call rather than by wrapping the function (`pydantic.validate_call`):
    a hung sync tool then blocks in its own frames only. A daemon thread still blocked when the
    interpreter exits is unwound, and unwinding through pydantic-core's Rust frames aborts the process.
    """
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    if any(p.kind not in named for p in signature.parameters.values()):
        return None
    hints = typing.get_type_hints(fn)
    fields = {name: (hints.get(name, Any), ... if p.default is p.empty else p.default)
              for name, p in signature.parameters.items()}
    config = pydantic.ConfigDict(arbitrary_types_allowed=True, extra="forbid")
    return pydantic.create_model(f"{fn.__name__}_arguments", __config__=config, **fields)


def as_tools(tools: Sequence[Callable[..., Any] | Tool], timeout_s: float | None = 10.0) -> dict[str, Tool]:
    """Tools by name (functions wrapped with `timeout_s`); two tools with one name are an error."""
    out: dict[str, Tool] = {}
    for fn in tools:
        tool = fn if isinstance(fn, Tool) else Tool(fn, timeout_s)
        if tool.name in out:
            raise ValueError(f"two tools are named {tool.name!r}; tool names must be unique")
        out[tool.name] = tool
    return out


def select_tools(tools: Mapping[str, Tool], names: Sequence[str] | None, where: str = "row") -> dict[str, Tool]:
    """The subset a row allows (`extra_info["tools"]`: a list of names); None: every tool."""
    if names is None:
        return dict(tools)
    unknown = [n for n in names if n not in tools]
    if unknown:
        raise ValueError(f"{where}: extra_info['tools'] names {unknown}, which are not among the environment's tools "
                         f"{sorted(tools)}")
    return {n: tools[n] for n in names}


async def run_calls(calls: Sequence[ToolCall], tools: Mapping[str, Tool]) -> list[ToolResult]:
    """Every call of one turn, concurrently; a call to a tool the row does not have is an error result."""

    async def one(call: ToolCall) -> ToolResult:
        tool = tools.get(call.name)
        if tool is None:
            return ToolResult(call.name, f"error: unknown tool {call.name!r}; available: {', '.join(sorted(tools))}",
                              "unknown_tool")
        return await tool.call(call)

    return list(await asyncio.gather(*(one(c) for c in calls)))


def in_daemon_thread(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> asyncio.Future:
    """`fn(*args, **kwargs)` in a daemon thread, as an awaitable of the running loop.

    Not `asyncio.to_thread`: its executor's threads are joined when the loop and the interpreter
    shut down, so one call that never returns would hang the run. A daemon thread that outlives
    its timeout is abandoned (it dies with the process).
    """
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(setter: Callable[[Any], None], value: Any) -> None:
        if not future.done():
            setter(value)

    def target() -> None:
        try:
            value = fn(*args, **kwargs)
        except BaseException as err:  # noqa: BLE001 - handed to the awaiting coroutine
            deliver(future.set_exception, err)
            return
        deliver(future.set_result, value)

    def deliver(setter: Callable[[Any], None], value: Any) -> None:
        try:
            loop.call_soon_threadsafe(settle, setter, value)
        except RuntimeError:  # the loop closed after giving up on this call
            pass

    threading.Thread(target=target, name=f"rlhf-agent-{getattr(fn, '__name__', 'call')}", daemon=True).start()
    return future
