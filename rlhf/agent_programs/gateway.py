"""The recording gateway of `rlhf serve --sessions` on the trainer's live `generate`, for one rollout.

`LiveGateway(generate, ...)` builds the same FastAPI app as `rlhf serve MODEL --sessions`
(rlhf.serve.build_app with a SessionStore: token-exact trajectories per session id) around an
engine that calls the trainer's `generate` (the policy group's, or the asynchronous rollout group's),
and runs it on an event loop of its own thread. Each attempt gets an `openai.AsyncOpenAI` whose base URL
is `<gateway>/sessions/<attempt id>/v1`, reached one of two ways:

- `"in_process"` (default): the client's httpx transport hands each request to the app on the gateway's
  loop (an ASGI call, no socket); the attempt's own loop awaits the answer.
- `"loopback"`: the app runs under uvicorn on a free 127.0.0.1 port and the client speaks HTTP to it.

Both were measured with benchmarks/agent_transport.py (docs/agents.md has the numbers); in-process is
cheaper per request and needs no port. Concurrent requests are batched into one `generate` by the
server's own scheduler: a batch starts as soon as every running attempt has sent its request
(`expect_requests`), or `batch_wait_ms` after the oldest request when some attempt is busy elsewhere
(running a tool, thinking). Measured on SmolLM2, 8 attempts of the calculator agent: with a fixed 20 ms
wait their first requests went out as 2 generate calls of 4 rows (36 s for the rollout), with this rule
as 1 call of 8 (13 s).

The trainer decides how to sample, not the agent: every chat request's `temperature`, `top_p` and
`top_k` are replaced by the trainer's SamplingParams, its `seed` dropped (a seeded request would run
alone), its `max_tokens` capped at `sampling.max_new_tokens`, and its `model` set to the served one (an
agent written for a production model name runs unchanged). So GRPO samples at the trainer's
temperature, an evaluator's greedy sampling makes the agent greedy, and the log-probs recorded are
those of the temperature the loss divides by.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import json
import threading
from collections.abc import Callable, Sequence
from typing import Any, Literal

import httpx
import openai
from transformers import PreTrainedTokenizerBase

from rlhf.agents.parsers import ToolCallParser
from rlhf.batch import Batch
from rlhf.rollout.sampling import SamplingParams
from rlhf.serve.app import ServeLimits, build_app
from rlhf.serve.gateway import SessionStore
from rlhf.serve.server import BackgroundServer

Transport = Literal["in_process", "loopback"]
Generate = Callable[[Batch, SamplingParams], Batch]
SERVED_NAME = "policy"  # the model name the gateway serves (requests may name any: it is rewritten)
IN_PROCESS_URL = "http://rlhf-gateway"  # the base of an in-process client's URLs (never resolved)


class GenerateEngine:
    """A `generate(batch, sampling)` function as the rollout engine the server's scheduler calls.

    The trainer's sampling wins over the request's (see the module docstring); only the request's
    token limit is kept. The policy versions of the rows it generated (asynchronous rollout tags them)
    are collected in `versions`; a failure of `generate` is kept in `errors` (the server answers the
    agents 500, and the rollout raises it afterwards: a broken engine must stop the step, not look like
    agents that all failed).
    """

    def __init__(self, generate: Generate, tokenizer: PreTrainedTokenizerBase, sampling: SamplingParams,
                 eos_token_ids: Sequence[int], max_model_len: int):
        self._generate = generate
        self.tokenizer = tokenizer
        self.sampling = sampling
        self.eos_token_ids = list(eos_token_ids)
        self.pad_token_id = tokenizer.pad_token_id
        self.max_model_len = max_model_len
        self.versions: list[int] = []
        self.errors: list[BaseException] = []
        self.calls = 0
        self.rows = 0

    def generate(self, prompts: Batch, sampling: SamplingParams, seed: int | None = None) -> Batch:
        turn = dataclasses.replace(self.sampling, n=1,
                                   max_new_tokens=min(sampling.max_new_tokens, self.sampling.max_new_tokens))
        try:
            out = self._generate(prompts, turn)
        except BaseException as err:
            self.errors.append(err)
            raise
        self.calls += 1
        self.rows += len(prompts)
        if "policy_version" in out:
            self.versions.extend(int(v) for v in out["policy_version"].tolist())
        return out


class TrainerSampling:
    """ASGI middleware: each chat request samples as the trainer says (module docstring), then goes to `app`."""

    def __init__(self, app, sampling: SamplingParams):
        self.app = app
        self.sampling = sampling

    def rewrite(self, body: dict) -> dict:
        body = dict(body)
        body["model"] = SERVED_NAME
        body["temperature"] = self.sampling.temperature
        body["top_p"] = self.sampling.top_p
        body["top_k"] = self.sampling.top_k
        body.pop("seed", None)
        requested = body.pop("max_completion_tokens", None) or body.pop("max_tokens", None)
        if isinstance(requested, int) and 0 < requested < self.sampling.max_new_tokens:
            body["max_tokens"] = requested  # shorter than the trainer's limit: the agent's own choice
        # else the server's default: the trainer's limit, or what the context has room for
        return body

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST" or not scope["path"].endswith("/chat/completions"):
            await self.app(scope, receive, send)
            return
        body, more = b"", True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                await self.app(scope, receive, send)
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
        try:
            parsed = json.loads(body)
        except ValueError:
            parsed = None  # the app answers a body it cannot parse with its own 400
        if isinstance(parsed, dict):
            body = json.dumps(self.rewrite(parsed)).encode()
        headers = [(k, v) for k, v in scope["headers"] if k.lower() != b"content-length"]
        scope = {**scope, "headers": headers + [(b"content-length", str(len(body)).encode())]}
        delivered = False

        async def replay():
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


class _OnGatewayLoop(httpx.AsyncBaseTransport):
    """An httpx transport that runs each request through the app on the gateway's event loop (in-process).

    The attempt's client lives on the attempt's own loop (its thread); the app and its scheduler live on the
    gateway's. The request crosses as bytes and the whole response comes back (the server sends a streamed
    reply only once its batch has finished generating, so nothing is lost by not streaming across).
    """

    def __init__(self, app, loop: asyncio.AbstractEventLoop):
        self.asgi = httpx.ASGITransport(app=app)
        self.loop = loop

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = await request.aread()
        method, url, headers = request.method, request.url, request.headers.raw

        async def on_gateway() -> tuple[int, list, bytes]:
            response = await self.asgi.handle_async_request(httpx.Request(method, url, headers=headers, content=body))
            return response.status_code, response.headers.raw, await response.aread()

        future = asyncio.run_coroutine_threadsafe(on_gateway(), self.loop)
        status, raw_headers, content = await asyncio.wrap_future(future)  # cancelling this cancels it there too
        headers = [(k, v) for k, v in raw_headers if k.lower() not in (b"content-length", b"transfer-encoding")]
        return httpx.Response(status, headers=headers, content=content, request=request)


class LiveGateway:
    """The gateway app on `generate` for one rollout (a context manager): `client(session id)` per attempt,
    `sessions` the recorded trajectories."""

    def __init__(
        self,
        generate: Generate,
        tokenizer: PreTrainedTokenizerBase,
        sampling: SamplingParams,
        *,
        eos_token_ids: Sequence[int],
        max_prompt_length: int,
        max_response_tokens: int,
        tool_parser: ToolCallParser | None,
        max_batch_size: int,
        batch_wait_ms: float,
        timeout_s: float,
        transport: Transport = "in_process",
    ):
        self.engine = GenerateEngine(generate, tokenizer, sampling, eos_token_ids,
                                     max_model_len=max_prompt_length + max_response_tokens)
        self.sessions = SessionStore(tokenizer, eos_token_ids, max_sessions=1 << 30,
                                     max_response_tokens=max_response_tokens)
        limits = ServeLimits(max_request_bytes=64 << 20, max_tokens_limit=sampling.max_new_tokens,
                             max_batch_size=max_batch_size, batch_wait_ms=batch_wait_ms,
                             max_queue=max(512, 4 * max_batch_size), queue_timeout_s=timeout_s)
        self.app = build_app(self.engine, SERVED_NAME, limits, sessions=self.sessions, tool_parser=tool_parser)
        self.asgi = TrainerSampling(self.app, sampling)
        self._max_batch_size = max_batch_size
        self.transport = transport
        self.timeout_s = timeout_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lifespan = None
        self._server: BackgroundServer | None = None
        self.base_url = IN_PROCESS_URL

    # ------------------------------------------------------------ lifetime
    def __enter__(self) -> LiveGateway:
        if self.transport == "loopback":
            self._server = BackgroundServer(self.asgi).__enter__()
            self.base_url = self._server.url
            return self
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="rlhf-agent-gateway", daemon=True)
        self._thread.start()
        self._lifespan = self.app.router.lifespan_context(self.app)  # starts the server's scheduler
        self._on_loop(self._lifespan.__aenter__())
        return self

    def __exit__(self, *exc) -> None:
        if self._server is not None:
            self._server.__exit__(*exc)
            return
        try:
            self._on_loop(self._lifespan.__aexit__(None, None, None), timeout=60)  # fails what is still queued
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=30)
            if not self._thread.is_alive():
                self._loop.close()

    def expect_requests(self, attempts: int) -> None:
        """`attempts` are running: a batch is complete once that many requests are queued."""
        scheduler = self.app.state.scheduler
        scheduler.max_batch_size = max(1, min(attempts, self._max_batch_size))
        scheduler.wake()

    def _on_loop(self, coroutine, timeout: float | None = 60) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    # ------------------------------------------------------------- clients
    def client(self, session_id: str) -> openai.AsyncOpenAI:
        """A client for one attempt, made on (and bound to) the attempt's own event loop."""
        # plain http on this machine: no certificates to load (an SSL context took 20 ms to 2 s here), no proxy
        # variables to read (45 ms)
        if self.transport == "loopback":
            http = httpx.AsyncClient(timeout=self.timeout_s, verify=False, trust_env=False)
        else:
            http = httpx.AsyncClient(transport=_OnGatewayLoop(self.asgi, self._loop), timeout=self.timeout_s,
                                     trust_env=False)
        return openai.AsyncOpenAI(base_url=f"{self.base_url}/sessions/{session_id}/v1", api_key="rlhf",
                                  http_client=http, max_retries=0, timeout=self.timeout_s)


def run_in_thread(coroutine_function: Callable[[], Any]) -> tuple[concurrent.futures.Future, Callable[[], None]]:
    """Run `coroutine_function()` on a fresh event loop in a daemon thread: (its result's future, cancel).

    An attempt that blocks its loop (`time.sleep` in `async def`) then holds up only its own thread; `cancel`
    asks its task to stop, and a thread that does not is abandoned (it dies with the process).
    """
    result: concurrent.futures.Future = concurrent.futures.Future()
    ready = threading.Event()
    handle: dict[str, Any] = {}

    def main() -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        task = loop.create_task(coroutine_function())
        handle["loop"], handle["task"] = loop, task
        ready.set()
        try:
            result.set_result(loop.run_until_complete(task))
        except BaseException as err:  # noqa: BLE001 - the attempt's own failure, reported by its future
            if not result.done():
                result.set_exception(err)
        finally:
            for leftover in asyncio.all_tasks(loop):
                leftover.cancel()
            try:
                loop.run_until_complete(asyncio.sleep(0))
            finally:
                loop.close()

    threading.Thread(target=main, name="rlhf-agent-attempt", daemon=True).start()
    ready.wait()

    def cancel() -> None:
        try:
            handle["loop"].call_soon_threadsafe(handle["task"].cancel)
        except RuntimeError:  # its loop has closed: it already finished
            pass

    return result, cancel
