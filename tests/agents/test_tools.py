"""Tools: schemas from signature and docstring, validated calls, and failures that come back as text."""

import asyncio
import time

import pytest

from rlhf.agents.tools import Tool, ToolCall, as_tools, run_calls, select_tools


def add(a: int, b: int) -> int:
    """Add two integers exactly.

    Args:
        a: the first addend
        b: the second addend
    """
    return a + b


def divide(a: float, b: float) -> float:
    """Divide a by b.

    Args:
        a: the dividend
        b: the divisor
    """
    return a / b


def hang(seconds: float) -> str:
    """Sleep, then answer.

    Args:
        seconds: how long
    """
    time.sleep(seconds)
    return "woke"


async def lookup(key: str, default: str = "none") -> dict:
    """Look a key up.

    Args:
        key: what to look up
        default: the answer when it is missing
    """
    await asyncio.sleep(0)
    return {"key": key, "value": {"x": "1"}.get(key, default)}


def call(tool, *positional, **arguments):
    return asyncio.run(Tool(tool, timeout_s=0.3 if tool is hang else 10).call(ToolCall(tool.__name__, arguments, positional)))


def test_schema_comes_from_the_signature_and_docstring():
    assert Tool(add).schema == {"type": "function", "function": {
        "name": "add", "description": "Add two integers exactly.",
        "parameters": {"type": "object", "properties": {
            "a": {"type": "integer", "description": "the first addend"},
            "b": {"type": "integer", "description": "the second addend"}}, "required": ["a", "b"]},
        "return": {"type": "integer"}}}
    assert Tool(lookup).schema["function"]["parameters"]["required"] == ["key"]


def test_a_tool_without_documented_parameters_is_refused_with_the_fix():
    def bare(a: int) -> int:
        return a

    with pytest.raises(ValueError, match="bare.*Args:"):
        Tool(bare)


@pytest.mark.parametrize("tool, positional, arguments, content, error", [
    (add, (), {"a": 2, "b": 3}, "5", None),
    (add, (2, 3), {}, "5", None),
    (add, (), {"a": "12", "b": 3}, "15", None),  # lax validation: a numeric string is an int
    (add, (), {"a": 2}, "error: add(a: int, b: int) -> int: missing a required argument: 'b'", "invalid_arguments"),
    (add, (), {"a": 2, "b": 3, "c": 4}, "error: add(a: int, b: int) -> int: got an unexpected keyword argument 'c'",
     "invalid_arguments"),
    (add, (), {"a": "two", "b": 3},
     "error: invalid arguments for add: a: Input should be a valid integer, unable to parse string as an integer",
     "invalid_arguments"),
    (divide, (1, 0), {}, "error: divide raised ZeroDivisionError: float division by zero", "exception"),
    (lookup, ("x",), {}, '{"key": "x", "value": "1"}', None),
    (hang, (5.0,), {}, "error: hang timed out after 0.3 s", "timeout"),
])
def test_calls_and_their_failures(tool, positional, arguments, content, error):
    started = time.perf_counter()
    result = call(tool, *positional, **arguments)
    assert (result.content, result.error) == (content, error)
    assert time.perf_counter() - started < 2.0  # a hung tool costs its timeout, not its sleep


def test_calls_of_one_turn_run_concurrently_and_unknown_tools_are_errors():
    tools = as_tools([hang, add], timeout_s=2.0)
    started = time.perf_counter()
    results = asyncio.run(run_calls([ToolCall("hang", {"seconds": 0.4})] * 3 + [ToolCall("sub", {"a": 1})], tools))
    assert time.perf_counter() - started < 1.0  # three 0.4 s calls at once
    assert [r.content for r in results[:3]] == ["woke"] * 3
    assert results[3].error == "unknown_tool" and "available: add, hang" in results[3].content


def test_per_row_tool_subset():
    tools = as_tools([add, divide])
    assert list(select_tools(tools, ["divide"])) == ["divide"]
    assert list(select_tools(tools, None)) == ["add", "divide"]
    with pytest.raises(ValueError, match=r"row 7: extra_info\['tools'\] names \['sub'\]"):
        select_tools(tools, ["sub"], where="row 7")
    with pytest.raises(ValueError, match="two tools are named 'add'"):
        as_tools([add, add])


def test_the_python_tool_runs_in_the_code_sandbox():
    from rlhf.agents.library import python

    assert call(python, code="print(sum(range(5)))").content == "10"
    assert call(python, code="import sys\nprint('partial')\nsys.exit(3)").content == "partial\nerror: exit code 3"
    assert call(python, code="1/0").content == "error: ZeroDivisionError: division by zero"
    assert call(python, code="x = 1").content == "(the program printed nothing)"
