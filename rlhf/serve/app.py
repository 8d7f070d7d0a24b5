"""The FastAPI app: OpenAI's `/v1/completions`, `/v1/chat/completions` and `/v1/models`.

Handlers validate and tokenise on the event loop (cheap), queue a `Job` on the
`BatchScheduler`, and await its result while generation runs in the scheduler's worker
thread. Every failure is an OpenAI-style error body (`{"error": {...}}`) with the status
OpenAI would use: 400 bad request, 401 bad key, 404 unknown model or path, 413 body too
large, 429 queue full, 503 shutting down or overloaded, 500 engine failure.

Streaming (`stream: true`) sends OpenAI's chunks as server-sent events once the request's
batch has finished generating: one chunk per token, then the finish reason, then
`data: [DONE]`. The HF engine generates a whole batch in one `generate` call, so tokens
are not available earlier; waiting also lets a failure be a real HTTP status instead of an
error event in a 200 stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import math
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from rlhf.agents.parsers import ToolCallParser
from rlhf.agents.trajectory import ChatRenderer
from rlhf.data.tokenize import chat_prompt_ids
from rlhf.rollout.engine import RolloutEngine
from rlhf.serve.completion import Completion
from rlhf.serve.gateway import PlannedTurn, Session, SessionStore
from rlhf.serve.protocol import ApiError, ChatCompletionRequest, CompletionRequest, parse_request
from rlhf.serve.scheduler import BatchScheduler, Job, Overloaded, QueueFull, ShuttingDown
from rlhf.serve.tool_calls import AssistantMessage, assistant_message, check_template_renders_tools, request_tools

log = logging.getLogger("rlhf.serve")

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's documented default for /v1/completions


@dataclasses.dataclass(frozen=True)
class ServeLimits:
    """What one server accepts; every limit answers with an OpenAI error body, never a crash."""

    max_request_bytes: int = 1 << 20  # larger request bodies get 413
    max_tokens_limit: int = 1024  # max_tokens above this gets 400; also chat's default max_tokens
    max_batch_size: int = 32  # rows (prompts x n) per generate call; a request may not exceed it
    batch_wait_ms: float = 10.0  # how long the oldest queued request waits for others to batch with
    max_queue: int = 512  # requests waiting for the engine; more get 429
    queue_timeout_s: float = 600.0  # a request still queued after this gets 503 (overloaded)


def build_app(
    engine: RolloutEngine,
    model_name: str,
    limits: ServeLimits = ServeLimits(),
    api_key: str | None = None,
    model_aliases: Sequence[str] = (),
    sessions: SessionStore | None = None,  # gateway mode: record trajectories under /sessions/{id}/v1 (rlhf.serve.gateway)
    tool_parser: ToolCallParser | None = None,  # serves `tools=`: reads the model's calls (rlhf.serve.tool_calls)
) -> FastAPI:
    """An app serving `engine` as model `model_name` (requests may also name one of `model_aliases`)."""
    server = _Server(engine, model_name, limits, api_key, model_aliases, tool_parser)
    app = FastAPI(title="rlhf serve", lifespan=server.lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.scheduler = server.scheduler
    app.state.on_shutdown = server.on_shutdown  # callables run once the scheduler has stopped (`rlhf serve`'s log)
    _error_handlers(app)
    _openai_routes(app, server)
    if sessions is not None:
        _session_routes(app, server, sessions)
    return app


class _Server:
    """What the routes share: the engine behind its scheduler, the limits, and the checks every request passes."""

    def __init__(self, engine: RolloutEngine, model_name: str, limits: ServeLimits, api_key: str | None,
                 model_aliases: Sequence[str], tool_parser: ToolCallParser | None):
        self.engine, self.tokenizer, self.model_name = engine, engine.tokenizer, model_name
        self.limits, self.api_key, self.tool_parser = limits, api_key, tool_parser
        self.names = {model_name, *model_aliases}
        self.created = int(time.time())
        self.on_shutdown: list[Callable[[], None]] = []  # run once the scheduler has stopped
        self.scheduler = BatchScheduler(
            engine,
            max_batch_size=limits.max_batch_size,
            batch_wait_s=limits.batch_wait_ms / 1000,
            max_queue=limits.max_queue,
            queue_timeout_s=limits.queue_timeout_s,
        )

    @contextlib.asynccontextmanager
    async def lifespan(self, app: FastAPI):
        self.scheduler.start()
        try:
            yield
        finally:
            await self.scheduler.close()
            for callback in self.on_shutdown:
                callback()

    # --------------------------------------------------------------- checks
    def authorize(self, request: Request) -> None:
        if self.api_key is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(token.strip().encode(), self.api_key.encode()):
            raise ApiError(
                401,
                "Incorrect or missing API key: send `Authorization: Bearer <key>`.",
                code="invalid_api_key",
            )

    async def read_json(self, request: Request) -> object:
        limit = self.limits.max_request_bytes
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise _too_large(limit)
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise _too_large(limit)
        try:
            return json.loads(body)
        except (ValueError, UnicodeDecodeError) as err:
            raise ApiError(400, f"We could not parse the JSON body of your request ({err}).") from None

    def check_model(self, name: str) -> None:
        if name not in self.names:
            raise ApiError(
                404, f"The model `{name}` does not exist; this server serves `{self.model_name}`.", param="model",
                code="model_not_found",
            )

    def max_tokens(self, requested: int | None, prompts: list[list[int]], default: int, param: str,
                   prompt_param: str) -> int:
        """The request's max_tokens (or `default`), checked against the limit and the context length."""
        context, limit = self.engine.max_model_len, self.limits.max_tokens_limit
        room = context - max(len(p) for p in prompts)
        if room < 1:
            raise ApiError(
                400, f"This model's maximum context length is {context} tokens; the prompt has "
                f"{context - room}.", param=prompt_param, code="context_length_exceeded",
            )
        if requested is None:
            return min(default, room)
        if requested > limit:
            raise ApiError(
                400, f"{param}={requested} is above this server's limit of {limit}.",
                param=param, code="max_tokens_too_large",
            )
        if requested > room:
            raise ApiError(
                400, f"This model's maximum context length is {context} tokens: the prompt "
                f"({context - room}) plus {param} ({requested}) exceeds it.",
                param=param, code="context_length_exceeded",
            )
        return requested

    async def run(self, job: Job) -> list[Completion]:
        if job.rows > self.limits.max_batch_size:
            raise ApiError(
                400, f"n x prompts = {job.rows} exceeds this server's batch size ({self.limits.max_batch_size}).",
                param="n",
            )
        try:
            return await self.scheduler.submit(job)
        except QueueFull as err:
            raise ApiError(429, f"Server queue is full: {err}. Retry later.", type="rate_limit_error",
                           code="queue_full") from None
        except ShuttingDown:
            raise ApiError(503, "The server is shutting down.", type="server_error", code="shutting_down") from None
        except Overloaded as err:
            raise ApiError(503, f"The server is overloaded: {err}.", type="server_error", code="overloaded") from None
        except Exception as err:  # the engine failed on this batch (logged by the scheduler)
            raise ApiError(500, f"Generation failed: {type(err).__name__}: {err}", type="server_error") from None

    # ------------------------------------------------------------- chat
    def chat_prompt(self, messages: list[dict], tools: list[dict] | None) -> list[int]:
        """The prompt ids of a stateless chat request; a template that cannot render it is a 400."""
        try:
            if tools:
                renderer = ChatRenderer(self.tokenizer, tools=tools, eos_token_ids=self.engine.eos_token_ids)
                check_template_renders_tools(renderer, messages)
                return renderer.encode(renderer.text(messages, generation_prompt=True))
            return chat_prompt_ids(self.tokenizer, messages)
        except ApiError:
            raise
        except Exception as err:  # the model's chat template rejected the messages
            raise ApiError(400, f"The chat template could not render these messages: {err}", param="messages")

    def chat_job(self, req: ChatCompletionRequest, prompt: list[int]) -> Job:
        """The generation job of a chat request, its max_tokens checked against the limit and the context."""
        requested = req.max_completion_tokens or req.max_tokens
        param = "max_completion_tokens" if req.max_completion_tokens else "max_tokens"
        limit = self.max_tokens(requested, [prompt], self.limits.max_tokens_limit, param, "messages")
        return Job([prompt], max_tokens=limit, **_sampling(req))

    def assistant_messages(self, req: ChatCompletionRequest, choices: list[Completion],
                           tools: list[dict] | None) -> list[AssistantMessage]:
        parallel = req.parallel_tool_calls is not False
        return [assistant_message(c.text, self.tool_parser, tools, parallel) for c in choices]

    def chat_reply(self, req: ChatCompletionRequest, prompt: list[int], choices: list[Completion],
                   messages: list[AssistantMessage]):
        reply = _Reply(f"chatcmpl-{uuid.uuid4().hex}", "chat.completion", int(time.time()), self.model_name)
        if req.stream:
            usage = req.stream_options is not None and bool(req.stream_options.include_usage)
            return _sse(reply.chat_chunks(choices, messages, bool(req.logprobs), len(prompt), usage, self.tokenizer))
        return reply.chat(choices, messages, bool(req.logprobs), len(prompt), self.tokenizer)


def _sampling(request: CompletionRequest | ChatCompletionRequest) -> dict:
    """A request's sampling settings as `Job` fields."""
    return {
        "n": request.n,
        "temperature": 1.0 if request.temperature is None else request.temperature,
        "top_p": 1.0 if request.top_p is None else request.top_p,
        "top_k": request.top_k or 0,
        "stop": request.stop_strings(),
        "seed": request.seed,
    }


def _error_handlers(app: FastAPI) -> None:
    """Every failure as an OpenAI error body with the status OpenAI would use."""

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, err: ApiError) -> JSONResponse:
        headers = {"Retry-After": "1"} if err.status in (429, 503) else None
        return JSONResponse(err.body(), status_code=err.status, headers=headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, err: StarletteHTTPException) -> JSONResponse:
        message = f"{request.method} {request.url.path}: {err.detail}"
        return JSONResponse(ApiError(err.status_code, message).body(), status_code=err.status_code)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, err: RequestValidationError) -> JSONResponse:
        return JSONResponse(ApiError(400, str(err)).body(), status_code=400)

    @app.exception_handler(Exception)
    async def _server_error(request: Request, err: Exception) -> JSONResponse:
        log.exception("unhandled error on %s", request.url.path)
        body = ApiError(500, f"Internal server error ({type(err).__name__}).", type="server_error").body()
        return JSONResponse(body, status_code=500)


def _openai_routes(app: FastAPI, server: _Server) -> None:
    """`/health`, `/v1/models`, `/v1/completions`, `/v1/chat/completions`."""
    v1 = [Depends(server.authorize)]
    engine, tokenizer = server.engine, server.tokenizer

    @app.get("/health")
    async def health() -> dict:
        scheduler = server.scheduler
        return {
            "status": "ok", "queued": scheduler.queued, "batches": scheduler.batches_run, "rows": scheduler.rows_run
        }

    @app.get("/v1/models", dependencies=v1)
    async def models() -> dict:
        return {"object": "list", "data": [_model_card(server.model_name, server.created, engine.max_model_len)]}

    @app.get("/v1/models/{name:path}", dependencies=v1)
    async def model(name: str) -> dict:
        server.check_model(name)
        return _model_card(server.model_name, server.created, engine.max_model_len)

    @app.post("/v1/completions", dependencies=v1)
    async def completions(request: Request):
        req = parse_request(CompletionRequest, await server.read_json(request))
        server.check_model(req.model)
        prompts = _completion_prompts(req.prompt, tokenizer)
        limit = server.max_tokens(req.max_tokens, prompts, COMPLETIONS_DEFAULT_MAX_TOKENS, "max_tokens", "prompt")
        choices = await server.run(Job(prompts, max_tokens=limit, **_sampling(req)))
        echoes = [tokenizer.decode(p, skip_special_tokens=True) if req.echo else "" for p in prompts]
        echoes = [e for e in echoes for _ in range(req.n)]
        prompt_tokens = sum(len(p) for p in prompts)
        reply = _Reply(f"cmpl-{uuid.uuid4().hex}", "text_completion", int(time.time()), server.model_name)
        with_logprobs = req.logprobs is not None
        if req.stream:
            usage = req.stream_options is not None and bool(req.stream_options.include_usage)
            return _sse(reply.completion_chunks(choices, echoes, with_logprobs, prompt_tokens, usage, tokenizer))
        return reply.completion(choices, echoes, with_logprobs, prompt_tokens, tokenizer)

    @app.post("/v1/chat/completions", dependencies=v1)
    async def chat_completions(request: Request):
        req = parse_request(ChatCompletionRequest, await server.read_json(request))
        server.check_model(req.model)
        tools = request_tools(req, server.tool_parser)
        prompt = server.chat_prompt([m.template_dict() for m in req.messages], tools)
        choices = await server.run(server.chat_job(req, prompt))
        return server.chat_reply(req, prompt, choices, server.assistant_messages(req, choices, tools))


def _session_routes(app: FastAPI, server: _Server, sessions: SessionStore) -> None:
    """Gateway mode: chat completions recorded per session, and the records (see rlhf.serve.gateway)."""
    v1 = [Depends(server.authorize)]
    if sessions.max_model_len is None:
        sessions.max_model_len = server.engine.max_model_len

    @app.post("/sessions/{session_id}/v1/chat/completions", dependencies=v1)
    async def session_chat(session_id: str, request: Request):
        req = parse_request(ChatCompletionRequest, await server.read_json(request))
        server.check_model(req.model)
        if req.n != 1:
            raise ApiError(400, "A session records one trajectory per conversation: n must be 1 (send n requests "
                           "in n sessions to sample n conversations).", param="n")
        tools = request_tools(req, server.tool_parser)
        messages = [m.template_dict() for m in req.messages]
        async with sessions.open(session_id) as session:  # one turn at a time: each continues the ids of the last
            planned = _plan(sessions, session, messages, tools)
            job = server.chat_job(req, planned.prompt_ids)  # every check passes before anything is recorded
            job.max_tokens = min(job.max_tokens, planned.room)  # the reply ends where the record must
            choices = await server.run(job)
            replies = server.assistant_messages(req, choices, tools)
            temperature = 1.0 if not req.temperature else req.temperature  # the log-probs' (greedy: 1)
            (choice,) = choices
            sessions.commit(session, planned, choice.token_ids, choice.log_probs, temperature, text=choice.text,
                            reply=replies[0].to_dict())
        return server.chat_reply(req, planned.prompt_ids, choices, replies)

    @app.get("/sessions/{session_id}", dependencies=v1)
    async def session_record(session_id: str) -> dict:
        session = sessions.get(session_id, create=False)
        if session is None:
            raise ApiError(404, f"No session {session_id!r} (it never made a request, or was dropped).")
        return {"session": session_id, **session.to_dict()}

    @app.post("/sessions/{session_id}/reward", dependencies=v1)
    async def session_reward(session_id: str, request: Request) -> dict:
        body = await server.read_json(request)
        session = sessions.get(session_id, create=False)
        if session is None or not session.trajectories:
            raise ApiError(404, f"No session {session_id!r} with a trajectory to reward.")
        reward = body.get("reward") if isinstance(body, dict) else None
        if not isinstance(reward, (int, float)) or isinstance(reward, bool):
            raise ApiError(400, 'The body must be {"reward": <number>}.', param="reward")
        if not math.isfinite(reward):
            raise ApiError(400, f"The reward must be a finite number, not {reward!r} (NaN, Infinity and numbers "
                           "beyond a double's range have no place in a loss).", param="reward")
        latest = session.trajectories[-1]
        latest.rewards.append(float(reward))
        return {"session": session_id, "rewards": latest.rewards}

    @app.delete("/sessions/{session_id}", dependencies=v1)
    async def session_drop(session_id: str) -> dict:
        return {"session": session_id, "deleted": sessions.drop(session_id)}


def _plan(sessions: SessionStore, session: Session, messages: list[dict], tools: list[dict] | None) -> PlannedTurn:
    """The session's plan for a request; a chat template that cannot render it (or ignores its tools) is a 400."""
    try:
        if tools:
            check_template_renders_tools(ChatRenderer(sessions.tokenizer, tools=tools), messages)
        return sessions.plan(session, messages, tools)
    except ApiError:
        raise
    except Exception as err:  # the chat template rejected the messages
        raise ApiError(400, f"The chat template could not render these messages: {err}", param="messages")


def _too_large(limit: int) -> ApiError:
    return ApiError(413, f"Request body is larger than this server's limit of {limit} bytes.",
                    code="request_too_large")


def _model_card(name: str, created: int, max_model_len: int) -> dict:
    return {"id": name, "object": "model", "created": created, "owned_by": "rlhf", "max_model_len": max_model_len}


def _completion_prompts(prompt: str | list, tokenizer) -> list[list[int]]:
    """Token ids of each prompt: a string, strings, token ids, or lists of token ids."""
    if isinstance(prompt, str):
        prompt = [prompt]
    if not prompt:
        raise ApiError(400, "prompt must not be empty.", param="prompt")
    if isinstance(prompt[0], int):
        prompt = [prompt]
    ids = [tokenizer(p)["input_ids"] if isinstance(p, str) else list(p) for p in prompt]
    vocab = len(tokenizer)
    for p in ids:
        if not p:
            raise ApiError(400, "prompt must not be empty.", param="prompt")
        if min(p) < 0 or max(p) >= vocab:
            raise ApiError(400, f"prompt token ids must be in [0, {vocab}).", param="prompt")
    return ids


def _sse(events: AsyncIterator[dict]) -> StreamingResponse:
    async def lines():
        async for event in events:
            yield f"data: {json.dumps(event, separators=(',', ':'))}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(
        lines(), media_type="text/event-stream", headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    )


def _usage(prompt_tokens: int, choices: list[Completion]) -> dict:
    completion_tokens = sum(len(c.token_ids) for c in choices)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def _token_strings(tokenizer, ids: list[int]) -> list[str]:
    return [tokenizer.decode([i]) for i in ids]


def _chat_logprobs(c: Completion, tokenizer, start: int = 0, stop: int | None = None) -> dict:
    ids, lps = c.token_ids[start:stop], c.log_probs[start:stop]
    content = [
        {"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}
        for t, lp in zip(_token_strings(tokenizer, ids), lps)
    ]
    return {"content": content, "refusal": None}


def _completion_logprobs(c: Completion, tokenizer, offset: int, start: int = 0, stop: int | None = None) -> dict:
    offsets, at = [], offset
    for piece in c.pieces:
        offsets.append(at)
        at += len(piece)
    return {
        "tokens": _token_strings(tokenizer, c.token_ids[start:stop]),
        "token_logprobs": c.log_probs[start:stop],
        "top_logprobs": None,
        "text_offset": offsets[start:stop],
    }


@dataclasses.dataclass(frozen=True)
class _Reply:
    """OpenAI response bodies and stream chunks for one request."""

    id: str
    object: str
    created: int
    model: str

    def _head(self, object: str) -> dict:
        return {"id": self.id, "object": object, "created": self.created, "model": self.model,
                "system_fingerprint": None}

    def chat(
        self, choices: list[Completion], messages: list[AssistantMessage], logprobs: bool, prompt_tokens: int,
        tokenizer,
    ) -> dict:
        return {
            **self._head("chat.completion"),
            "choices": [
                {
                    "index": i,
                    "message": m.to_dict(),
                    "logprobs": _chat_logprobs(c, tokenizer) if logprobs else None,
                    "finish_reason": m.finish_reason_override or c.finish_reason,
                }
                for i, (c, m) in enumerate(zip(choices, messages))
            ],
            "usage": _usage(prompt_tokens, choices),
        }

    def completion(
        self, choices: list[Completion], echoes: list[str], logprobs: bool, prompt_tokens: int, tokenizer
    ) -> dict:
        return {
            **self._head("text_completion"),
            "choices": [
                {
                    "index": i,
                    "text": echo + c.text,
                    "logprobs": _completion_logprobs(c, tokenizer, len(echo)) if logprobs else None,
                    "finish_reason": c.finish_reason,
                }
                for i, (c, echo) in enumerate(zip(choices, echoes))
            ],
            "usage": _usage(prompt_tokens, choices),
        }

    async def chat_chunks(
        self, choices: list[Completion], messages: list[AssistantMessage], logprobs: bool, prompt_tokens: int,
        usage: bool, tokenizer,
    ) -> AsyncIterator[dict]:
        """A choice's tokens one chunk each; a choice with tool calls as its content, then one chunk per call."""
        head = {**self._head("chat.completion.chunk"), **({"usage": None} if usage else {})}

        def chunk(index: int, delta: dict, lp=None, finish_reason=None) -> dict:
            choice = {"index": index, "delta": delta, "logprobs": lp, "finish_reason": finish_reason}
            return {**head, "choices": [choice]}

        for i in range(len(choices)):
            yield chunk(i, {"role": "assistant", "content": ""})
        calling = {i for i, m in enumerate(messages) if m.tool_calls}
        for i, t in _token_order(choices, with_empty=logprobs):
            if i in calling:
                continue
            lp = _chat_logprobs(choices[i], tokenizer, t, t + 1) if logprobs else None
            yield chunk(i, {"content": choices[i].pieces[t]}, lp)
            await asyncio.sleep(0)  # let other responses' chunks go out too
        for i in sorted(calling):
            lp = _chat_logprobs(choices[i], tokenizer) if logprobs else None
            if messages[i].content or lp:
                yield chunk(i, {"content": messages[i].content or ""}, lp)
            for k, call in enumerate(messages[i].tool_calls):
                yield chunk(i, {"tool_calls": [{"index": k, **call}]})
        for i, (c, m) in enumerate(zip(choices, messages)):
            yield chunk(i, {}, finish_reason=m.finish_reason_override or c.finish_reason)
        if usage:
            yield {**head, "choices": [], "usage": _usage(prompt_tokens, choices)}

    async def completion_chunks(
        self, choices: list[Completion], echoes: list[str], logprobs: bool, prompt_tokens: int, usage: bool,
        tokenizer,
    ) -> AsyncIterator[dict]:
        head = {**self._head("text_completion"), **({"usage": None} if usage else {})}

        def chunk(index: int, text: str, lp=None, finish_reason=None) -> dict:
            choice = {"index": index, "text": text, "logprobs": lp, "finish_reason": finish_reason}
            return {**head, "choices": [choice]}

        for i, echo in enumerate(echoes):
            if echo:
                yield chunk(i, echo)
        for i, t in _token_order(choices, with_empty=logprobs):
            lp = _completion_logprobs(choices[i], tokenizer, len(echoes[i]), t, t + 1) if logprobs else None
            yield chunk(i, choices[i].pieces[t], lp)
            await asyncio.sleep(0)
        for i, c in enumerate(choices):
            yield chunk(i, "", finish_reason=c.finish_reason)
        if usage:
            yield {**head, "choices": [], "usage": _usage(prompt_tokens, choices)}


def _token_order(choices: list[Completion], with_empty: bool) -> list[tuple[int, int]]:
    """(choice, token) pairs in generation order: token t of every choice before token t + 1."""
    longest = max(len(c.pieces) for c in choices)
    return [
        (i, t)
        for t in range(longest)
        for i, c in enumerate(choices)
        if t < len(c.pieces) and (with_empty or c.pieces[t])
    ]
