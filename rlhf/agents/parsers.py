"""Tool-call formats: the assistant's text -> its plain content, the calls it makes, and what was malformed.

A parser belongs to a model family (what its chat template and training taught it to write),
not to a task, so it is chosen beside the model in the graph:

- `HermesParser`: Qwen2.5 / Hermes / most tool-tuned chat models,
  `<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>` (several per turn).
- `PythonCallParser`: one call per line written as Python, `add(4821, 7390)`: short enough for a
  tiny byte-level model to learn from a few hundred demonstrations.
- `CodeBlockParser`: a fenced code block is a call of one tool with the block as its argument
  (a small instruct model writes ```python blocks unprompted).

Malformed calls never raise: each becomes an error string (returned to the model as an
observation, and counted as `tool_errors/parse`). `format` is the inverse of `parse`, used to
write demonstrations for SFT and golden trajectories.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import json
import re
from collections.abc import Sequence
from typing import Protocol

from rlhf.agents.tools import ToolCall


@dataclasses.dataclass(frozen=True)
class ParsedTurn:
    """One assistant message, parsed: `content` is its text outside any call."""

    content: str
    calls: tuple[ToolCall, ...] = ()
    errors: tuple[str, ...] = ()  # one message per malformed call, for the model to read


class ToolCallParser(Protocol):
    """Reads tool calls out of an assistant message, and writes them (the inverse)."""

    def parse(self, text: str) -> ParsedTurn: ...

    def format(self, calls: Sequence[ToolCall], content: str = "") -> str: ...


@dataclasses.dataclass(frozen=True)
class HermesParser:
    """`<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks (Qwen2.5, Hermes)."""

    open_tag: str = "<tool_call>"
    close_tag: str = "</tool_call>"

    def parse(self, text: str) -> ParsedTurn:
        calls, errors, outside, at = [], [], [], 0
        block = re.compile(re.escape(self.open_tag) + r"(.*?)" + re.escape(self.close_tag), re.DOTALL)
        for match in block.finditer(text):
            outside.append(text[at : match.start()])
            at = match.end()
            call, error = self._call(match.group(1).strip())
            if call is not None:
                calls.append(call)
            else:
                errors.append(error)
        rest = text[at:]
        if self.open_tag in rest:
            start = rest.index(self.open_tag)
            outside.append(rest[:start])
            errors.append(f"a tool call was opened with {self.open_tag} but never closed with {self.close_tag}")
        else:
            outside.append(rest)
        return ParsedTurn("".join(outside).strip(), tuple(calls), tuple(errors))

    def _call(self, body: str) -> tuple[ToolCall | None, str]:
        try:
            obj = json.loads(body)
        except json.JSONDecodeError as err:
            return None, f"the tool call {_clip(body)!r} is not valid JSON ({err.msg} at character {err.pos})"
        except RecursionError:  # JSON nested deeper than Python's recursion limit (a model can sample that)
            return None, f"the tool call {_clip(body)!r} is nested too deeply to read"
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return None, f'the tool call {_clip(body)!r} must be a JSON object with a string "name"'
        arguments = obj.get("arguments", obj.get("parameters", {}))
        if isinstance(arguments, str):  # OpenAI's wire format: the arguments as a JSON string
            try:
                arguments = json.loads(arguments)
            except (json.JSONDecodeError, RecursionError):
                return None, f"the arguments of tool call {obj['name']!r} are a string that is not JSON"
        if not isinstance(arguments, dict):
            return None, f'the "arguments" of tool call {obj["name"]!r} must be a JSON object'
        return ToolCall(obj["name"], arguments), ""

    def format(self, calls: Sequence[ToolCall], content: str = "") -> str:
        blocks = [
            f"{self.open_tag}\n{json.dumps({'name': c.name, 'arguments': dict(c.arguments)}, ensure_ascii=False)}\n"
            f"{self.close_tag}"
            for c in calls
        ]
        return "\n".join(([content] if content else []) + blocks)


@dataclasses.dataclass(frozen=True)
class PythonCallParser:
    """Lines written as Python calls with literal arguments, `add(4821, 7390)` or `add(a=1, b=2)`.

    A line counts as a call when it starts with an identifier directly followed by "(" (after
    `marker`, when one is set); other lines are content. A call-looking line that is not a call of
    literals is malformed.
    """

    marker: str = ""  # a prefix every call line must start with ("": none)

    @functools.cached_property
    def _looks_like_call(self) -> re.Pattern:
        return re.compile(re.escape(self.marker) + r"\s*[A-Za-z_]\w*\(")

    def parse(self, text: str) -> ParsedTurn:
        calls, errors, content = [], [], []
        for line in text.splitlines():
            stripped = line.strip()
            if not self._looks_like_call.match(stripped):
                content.append(line)
                continue
            call, error = self._call(stripped[len(self.marker):].strip())
            if call is not None:
                calls.append(call)
            else:
                errors.append(error)
        return ParsedTurn("\n".join(content).strip(), tuple(calls), tuple(errors))

    @staticmethod
    def _call(source: str) -> tuple[ToolCall | None, str]:
        try:
            node = ast.parse(source, mode="eval").body
        except SyntaxError as err:
            return None, f"could not parse the tool call {_clip(source)!r}: {err.msg}"
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
            return None, f"{_clip(source)!r} is not a single call of a tool by name, like add(1, 2)"
        try:
            positional = tuple(ast.literal_eval(a) for a in node.args)
            keywords = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
        except (ValueError, TypeError, SyntaxError):
            return None, f"the arguments of {_clip(source)!r} must be literals (numbers, strings, lists, ...)"
        if None in keywords:
            return None, f"{_clip(source)!r}: **arguments are not allowed in a tool call"
        return ToolCall(node.func.id, keywords, positional), ""

    def format(self, calls: Sequence[ToolCall], content: str = "") -> str:
        lines = [content] if content else []
        for c in calls:
            args = [repr(a) for a in c.positional] + [f"{k}={v!r}" for k, v in c.arguments.items()]
            lines.append(f"{self.marker}{c.name}({', '.join(args)})")
        return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class CodeBlockParser:
    """Each fenced code block (```python ... ```) is a call of `tool` with the block's code as `argument`."""

    tool: str = "python"  # the tool a block calls
    argument: str = "code"  # the parameter the block's code goes to
    language: str = "python"  # the fence's language tag

    @functools.cached_property
    def _block(self) -> re.Pattern:
        return re.compile(r"```" + re.escape(self.language) + r"[ \t]*\n(.*?)```", re.DOTALL)

    def parse(self, text: str) -> ParsedTurn:
        calls, outside, at = [], [], 0
        for match in self._block.finditer(text):
            outside.append(text[at : match.start()])
            at = match.end()
            calls.append(ToolCall(self.tool, {self.argument: match.group(1)}))
        rest = text[at:]
        errors = ()
        fence = "```" + self.language
        if fence in rest:
            outside.append(rest[: rest.index(fence)])
            errors = (f"a {fence} code block was opened but never closed with ```",)
        else:
            outside.append(rest)
        return ParsedTurn("".join(outside).strip(), tuple(calls), errors)

    def format(self, calls: Sequence[ToolCall], content: str = "") -> str:
        blocks = []
        for c in calls:
            code = c.arguments[self.argument]
            blocks.append(f"```{self.language}\n{code}{'' if code.endswith(chr(10)) else chr(10)}```")
        return "\n".join(([content] if content else []) + blocks)


def _clip(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
