"""OpenAI request schemas (validated strictly) and the error type every failure is reported with.

Requests are pydantic models with `extra="forbid"`: a misspelt or made-up field is a 400,
as on OpenAI's API. Every field OpenAI documents for `/v1/completions` and
`/v1/chat/completions` is accepted, so the official client's requests always parse; fields
that would change the output in a way this server cannot honour (penalties, logit bias,
top log-probs, audio...) are rejected by `unsupported()` with a 400 that names them,
rather than silently ignored. `tools` are served when the server has a tool-call parser
(rlhf.serve.tool_calls). Pure bookkeeping fields (`user`, `metadata`, `store`,
`service_tier`, prompt-cache hints...) are accepted and ignored.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError


class ApiError(Exception):
    """A failure reported to the client as `{"error": {"message", "type", "param", "code"}}`."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StreamOptions(_Strict):
    include_usage: bool | None = None  # one last chunk with `usage` and no choices
    include_obfuscation: bool | None = None  # accepted, ignored (there is no obfuscation padding)


class _Sampling(_Strict):
    """Fields shared by both endpoints."""

    model: str
    n: int = Field(1, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)  # None means 1.0, as on OpenAI's API
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0)  # not OpenAI's: vLLM's extension, 0 disables
    max_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None

    def stop_strings(self) -> tuple[str, ...]:
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return tuple(s for s in stop if s)

    def _common_unsupported(self) -> list[str]:
        bad = []
        if self.frequency_penalty:
            bad.append("frequency_penalty")
        if self.presence_penalty:
            bad.append("presence_penalty")
        if self.logit_bias:
            bad.append("logit_bias")
        return bad


class CompletionRequest(_Sampling):
    """`POST /v1/completions`."""

    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool | None = False
    logprobs: int | None = Field(None, ge=0)  # only 0 is served: the sampled tokens' log-probs
    best_of: int | None = None
    suffix: str | None = None

    def unsupported(self) -> list[str]:
        bad = self._common_unsupported()
        if self.logprobs:
            bad.append("logprobs")  # > 0 asks for the top alternatives, which the engine does not keep
        if self.best_of not in (None, self.n):
            bad.append("best_of")
        if self.suffix:
            bad.append("suffix")
        if self.echo and self.logprobs is not None:
            bad.append("echo with logprobs")  # would need the prompt's log-probs
        return bad


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    function_call: dict[str, Any] | None = None
    refusal: str | None = None
    audio: dict[str, Any] | None = None

    def template_dict(self) -> dict:
        """The message as a chat template expects it: text parts joined, developer as system, tool-call
        arguments as objects (OpenAI sends them as JSON strings; templates write them with `tojson`)."""
        content = self.content if isinstance(self.content, str) or self.content is None else "".join(
            part.text for part in self.content
        )
        message: dict[str, Any] = {"role": "system" if self.role == "developer" else self.role, "content": content or ""}
        if self.tool_calls:
            message["tool_calls"] = [_template_call(call, i) for i, call in enumerate(self.tool_calls)]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            message["name"] = self.name
        return message


def _template_call(call: dict[str, Any], index: int) -> dict[str, Any]:
    function = call.get("function")
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise ApiError(400, f'tool_calls[{index}] must be {{"id": ..., "type": "function", "function": {{"name": ..., '
                       '"arguments": "<JSON>"}}}}.', param=f"tool_calls[{index}]")
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            raise ApiError(400, f"The arguments of tool call {function['name']!r} are not valid JSON: {arguments!r}.",
                           param=f"tool_calls[{index}].function.arguments") from None
    return {**call, "type": call.get("type", "function"), "function": {**function, "arguments": arguments}}


class ChatCompletionRequest(_Sampling):
    """`POST /v1/chat/completions`."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)  # newer name of max_tokens; wins if both
    logprobs: bool | None = False
    top_logprobs: int | None = Field(None, ge=0)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    functions: list[dict[str, Any]] | None = None
    function_call: Any = None
    response_format: dict[str, Any] | None = None
    modalities: list[str] | None = None
    audio: dict[str, Any] | None = None
    prediction: dict[str, Any] | None = None
    web_search_options: dict[str, Any] | None = None
    # bookkeeping and hints: accepted, ignored
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    prompt_cache_options: dict[str, Any] | None = None
    reasoning_effort: str | None = None
    verbosity: str | None = None
    moderation: dict[str, Any] | None = None

    def unsupported(self) -> list[str]:
        bad = self._common_unsupported()
        if self.top_logprobs:
            bad.append("top_logprobs")
        if self.functions and self.function_call != "none":
            bad.append("functions")
        if self.response_format and self.response_format.get("type") != "text":
            bad.append("response_format")
        if self.modalities and self.modalities != ["text"]:
            bad.append("modalities")
        bad += [name for name in ("audio", "prediction", "web_search_options") if getattr(self, name)]
        bad += [f"messages[{i}].audio" for i, m in enumerate(self.messages) if m.audio]
        return bad


def parse_request(model: type[_Sampling], data: Any) -> _Sampling:
    """Validate a decoded JSON body; any problem is a 400 naming the offending field."""
    if not isinstance(data, dict):
        raise ApiError(400, "The request body must be a JSON object.")
    try:
        request = model.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        param = ".".join(str(p) for p in first["loc"]) or None
        if first["type"] == "extra_forbidden":
            message = f"Unrecognized request argument supplied: {param}"
        elif first["type"] == "missing":
            message = f"Missing required parameter: '{param}'."
        else:
            message = f"Invalid value for '{param}': {first['msg']}."
        raise ApiError(400, message, param=param) from None
    bad = request.unsupported()
    if bad:
        raise ApiError(
            400,
            f"Unsupported by this server: {', '.join(bad)} (see docs/serving.md for what is served).",
            param=bad[0],
            code="unsupported_parameter",
        )
    return request
