"""Tool-call parsers: table-driven cases per format (malformed calls become messages, never exceptions),
and format/parse round trips."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlhf.agents.parsers import CodeBlockParser, HermesParser, ParsedTurn, PythonCallParser
from rlhf.agents.tools import ToolCall

HERMES = [
    ("12211", ParsedTurn("12211")),
    ('<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>',
     ParsedTurn("", (ToolCall("add", {"a": 1, "b": 2}),))),
    ('Let me add.\n<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>\n'
     '<tool_call>{"name": "sub", "arguments": "{\\"a\\": 2}"}</tool_call>',  # arguments as a JSON string (OpenAI)
     ParsedTurn("Let me add.", (ToolCall("add", {"a": 1}), ToolCall("sub", {"a": 2})))),
    ('<tool_call>{"name": "add", "arguments": {"a": 1</tool_call>',
     ParsedTurn("", (), ("the tool call '{\"name\": \"add\", \"arguments\": {\"a\": 1' is not valid JSON "
                         "(Expecting ',' delimiter at character 36)",))),
    ('<tool_call>{"arguments": {}}</tool_call>',
     ParsedTurn("", (), ('the tool call \'{"arguments": {}}\' must be a JSON object with a string "name"',))),
    ('<tool_call>{"name": "add", "arguments": [1, 2]}</tool_call>',
     ParsedTurn("", (), ('the "arguments" of tool call \'add\' must be a JSON object',))),
    ('ok <tool_call>{"name": "add"', ParsedTurn("ok", (), ("a tool call was opened with <tool_call> but never "
                                                           "closed with </tool_call>",))),
]

PYTHON = [
    ("12211", ParsedTurn("12211")),
    ("add(4821, 7390)", ParsedTurn("", (ToolCall("add", {}, (4821, 7390)),))),
    ("First:\nadd(a=1, b=2)\nmul(3, [1, 2], k='x')",
     ParsedTurn("First:", (ToolCall("add", {"a": 1, "b": 2}), ToolCall("mul", {"k": "x"}, (3, [1, 2]))))),
    ("add(4821, ", ParsedTurn("", (), ("could not parse the tool call 'add(4821,': '(' was never closed",))),
    ("add(x, 2)", ParsedTurn("", (), ("the arguments of 'add(x, 2)' must be literals (numbers, strings, lists, ...)",))),
    ("add(1)(2)", ParsedTurn("", (), ("'add(1)(2)' is not a single call of a tool by name, like add(1, 2)",))),
    ("The answer (I think) is 3", ParsedTurn("The answer (I think) is 3")),  # prose is not a call
]

CODE = [
    ("no code", ParsedTurn("no code")),
    ("Run this:\n```python\nprint(1 + 1)\n```\nthen see.",
     ParsedTurn("Run this:\n\nthen see.", (ToolCall("python", {"code": "print(1 + 1)\n"}),))),
    ("```python\nprint(2)", ParsedTurn("", (), ("a ```python code block was opened but never closed with ```",))),
]


@pytest.mark.parametrize("text, parsed", HERMES)
def test_hermes(text, parsed):
    assert HermesParser().parse(text) == parsed


@pytest.mark.parametrize("text, parsed", PYTHON)
def test_python_calls(text, parsed):
    assert PythonCallParser().parse(text) == parsed


@pytest.mark.parametrize("text, parsed", CODE)
def test_code_blocks(text, parsed):
    assert CodeBlockParser().parse(text) == parsed


def test_a_marker_restricts_python_calls():
    assert PythonCallParser(marker="CALL ").parse("add(1, 2)\nCALL add(3, 4)") == ParsedTurn(
        "add(1, 2)", (ToolCall("add", {}, (3, 4)),))


names = st.from_regex(r"[a-z_][a-z0-9_]{0,8}", fullmatch=True)
values = st.one_of(st.integers(-10**6, 10**6), st.text(max_size=10), st.booleans(),
                   st.lists(st.integers(0, 9), max_size=3))
calls = st.lists(st.builds(ToolCall, names, st.dictionaries(names, values, max_size=3)), min_size=1, max_size=3)


@given(calls=calls)
def test_hermes_format_parse_round_trip(calls):
    parser = HermesParser()
    assert parser.parse(parser.format(calls, content="Let me see.")) == ParsedTurn("Let me see.", tuple(calls))


@given(calls=calls)
def test_python_format_parse_round_trip(calls):
    parser = PythonCallParser()
    assert parser.parse(parser.format(calls)) == ParsedTurn("", tuple(calls))
