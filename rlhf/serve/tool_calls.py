"""OpenAI function calling on the server: `tools=` into the chat template, tool calls out of the text.

An agent written against the `openai` client passes its functions as `tools=[{"type": "function",
"function": {...}}]` and reads `message.tool_calls` back. The model itself only reads and writes
text, so the server does both translations, as vLLM does with `--tool-call-parser`:

- in: the tools go to the model's chat template (`apply_chat_template(..., tools=...)`); a template
  that ignores them is refused, since the model would never learn the tools exist;
- out: the parser of the model family (rlhf.agents.parsers, the same one the agent loop trains
  with) reads the completion; well-formed calls become `tool_calls` with `finish_reason:
  "tool_calls"`, and a completion with a malformed call is returned as plain content, unchanged.

Assistant messages the client sends back with `tool_calls` reach the template as structured calls
(`ChatMessage.template_dict`), tool results as `tool` messages.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from rlhf.agents.parsers import ToolCallParser
from rlhf.agents.tools import ToolCall
from rlhf.agents.trajectory import ChatRenderer
from rlhf.serve.protocol import ApiError, ChatCompletionRequest


def request_tools(req: ChatCompletionRequest, parser: ToolCallParser | None) -> list[dict] | None:
    """The tools to render for this request (None: no function calling), or a 400 saying why not."""
    if not req.tools or req.tool_choice == "none":
        return None
    if parser is None:
        raise ApiError(400, "This server was started without a tool-call parser, so it cannot return tool calls: "
                       "restart it with `--tool-call-parser hermes` (or the format your model writes), or send "
                       "the request without `tools`.", param="tools", code="unsupported_parameter")
    if req.tool_choice not in (None, "auto"):
        raise ApiError(400, f"tool_choice={req.tool_choice!r} is not served: only 'auto' and 'none' (forcing a "
                       "call would need constrained decoding).", param="tool_choice", code="unsupported_parameter")
    for i, tool in enumerate(req.tools):
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if tool.get("type") != "function" or not isinstance(function, Mapping) or not function.get("name"):
            raise ApiError(400, f'tools[{i}] must be {{"type": "function", "function": {{"name": ..., '
                           '"parameters": {...}}}}.', param=f"tools[{i}]")
    return [dict(t) for t in req.tools]


def check_template_renders_tools(renderer: ChatRenderer, messages: Sequence[Mapping]) -> None:
    """400 unless the chat template writes the tools into the prompt (many small models' templates ignore them)."""
    if renderer.ignores_tools(messages):
        raise ApiError(400, "This model's chat template ignores `tools`, so the model would never see them. Describe "
                       "the tools in a system message and send the request without `tools`, or restart the server "
                       "with `--chat-template FILE`, a template that renders tools.", param="tools", code="unsupported_parameter")


@dataclasses.dataclass(frozen=True)
class AssistantMessage:
    """What a completion's text becomes in the reply: content and tool calls in OpenAI's wire format."""

    content: str | None
    tool_calls: list[dict[str, Any]] | None = None

    @property
    def finish_reason_override(self) -> str | None:
        return "tool_calls" if self.tool_calls else None

    def to_dict(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": self.content, "refusal": None}
        if self.tool_calls:
            message["tool_calls"] = self.tool_calls
        return message


def assistant_message(
    text: str, parser: ToolCallParser | None, tools: Sequence[Mapping] | None, parallel: bool = True
) -> AssistantMessage:
    """The reply's message for a completion: its calls when `tools` were offered and every call parsed."""
    if parser is None or not tools:
        return AssistantMessage(text)
    parsed = parser.parse(text)
    if not parsed.calls or parsed.errors:
        return AssistantMessage(text)  # no call, or a malformed one: the client sees exactly what was written
    calls = []
    for call in parsed.calls[: None if parallel else 1]:
        arguments = _named_arguments(call, tools)
        if arguments is None:
            return AssistantMessage(text)
        calls.append({"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                      "function": {"name": call.name, "arguments": json.dumps(arguments, ensure_ascii=False)}})
    return AssistantMessage(parsed.content or None, calls)


def _named_arguments(call: ToolCall, tools: Sequence[Mapping]) -> dict[str, Any] | None:
    """The call's arguments by name; positional ones (`add(1, 2)`) take the tool's parameters in order."""
    if not call.positional:
        return dict(call.arguments)
    schema = next((t["function"] for t in tools if t["function"].get("name") == call.name), None)
    names = list(((schema or {}).get("parameters") or {}).get("properties") or {})
    if len(call.positional) > len(names):
        return None  # a call the client could not map onto its function: left as text
    return {**dict(zip(names, call.positional)), **call.arguments}
