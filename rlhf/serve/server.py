"""`rlhf serve MODEL`: parse flags, load the model, run the app under uvicorn."""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import uvicorn
from fastapi import FastAPI

from rlhf.agents.parsers import CodeBlockParser, HermesParser, PythonCallParser, ToolCallParser
from rlhf.argtypes import POSITIVE, OneLineParser, number
from rlhf.models.loading import ModelNotFoundError
from rlhf.rollout.choose import engine_class
from rlhf.rollout.vllm_engine import VLLMEngine
from rlhf.serve.app import ServeLimits, build_app
from rlhf.serve.gateway import SessionStore

log = logging.getLogger("rlhf.serve")

# Longer than clients keep idle connections (httpx and so the openai client: 5 s). uvicorn's own
# default is also 5 s, so a client could reuse a connection just as the server closed it: a
# request lost with a connection reset under load.
KEEP_ALIVE_S = 65

# `--tool-call-parser`: the formats a model family writes its calls in (rlhf.agents.parsers), as vLLM names them
TOOL_CALL_PARSERS: dict[str, type[ToolCallParser]] = {
    "hermes": HermesParser, "pythonic": PythonCallParser, "code_block": CodeBlockParser,
}

_LIMIT_HELP = {
    "max_request_bytes": "request bodies above this many bytes get 413",
    "max_tokens_limit": "max_tokens above this gets 400; also chat's default max_tokens",
    "max_batch_size": "rows (prompts x n) per generate call; a request with more rows gets 400",
    "batch_wait_ms": "how long the oldest queued request waits for others to batch with",
    "max_queue": "requests waiting for the engine; further requests get 429",
    "queue_timeout_s": "a request still queued after this many seconds gets 503",
}


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = OneLineParser(
        prog="rlhf serve",
        description="Serve a model folder (a trainer's checkpoint is one) with OpenAI's API: "
        "/v1/completions, /v1/chat/completions, /v1/models.",
    )
    parser.add_argument("model", help="a Hugging Face model folder, e.g. runs/x/grpo/final, a PEFT adapter folder "
                        "(e.g. runs/x/grpo/final-adapter: served merged into its base), or a hub id")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback only)")
    parser.add_argument("--port", type=number(int, 0, 65535), default=8000)
    parser.add_argument(
        "--api-key", default=os.environ.get("RLHF_API_KEY"),
        help="require `Authorization: Bearer KEY` (default: $RLHF_API_KEY; none means no key)",
    )
    parser.add_argument("--served-model-name", help="the model id clients send (default: MODEL as given)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument(
        "--engine", default="auto", choices=["auto", "hf", "vllm"],
        help="rollout engine: transformers (hf) or vLLM; auto: vLLM on a GPU where it is installed, else hf",
    )
    parser.add_argument("--gpu-memory-utilization", type=number(float, 0, 1, low_open=True), default=0.5,
                        help="vLLM: fraction of GPU memory (of RAM on CPU) for weights and KV cache")
    parser.add_argument("--max-model-len", type=POSITIVE, default=None,
                        help="vLLM: prompt + response tokens per sequence (default: the model's limit)")
    parser.add_argument(
        "--sessions", action="store_true",
        help="gateway mode: record every chat completion under /sessions/ID/v1 as a token-exact trajectory "
        "(prompt ids, response ids, log-probs; GET /sessions/ID), for training on an agent's conversations",
    )
    parser.add_argument("--max-sessions", type=POSITIVE, default=10_000,
                        help="gateway mode: sessions kept (the least recently used beyond it are dropped)")
    parser.add_argument(
        "--tool-call-parser", choices=sorted(TOOL_CALL_PARSERS), default=None,
        help="serve OpenAI function calling (`tools=`): read the model's tool calls in this format (hermes: "
        "<tool_call>{json}</tool_call>, Qwen2.5 and most tool-tuned models; pythonic: add(1, 2) lines; "
        "code_block: a ```python block calls a `python` tool). Default: requests with tools are refused",
    )
    parser.add_argument(
        "--chat-template", metavar="FILE",
        help="a Jinja chat template to render chat requests with instead of the model's own (e.g. one that "
        "renders `tools` for a model whose template ignores them)",
    )
    parser.add_argument("--torch-threads", type=POSITIVE, default=1, help="torch CPU threads (the machine is shared)")
    parser.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    parser.add_argument(
        "--timeout-keep-alive", type=number(int, 0), default=KEEP_ALIVE_S,
        help=f"seconds an idle HTTP connection stays open (default {KEEP_ALIVE_S})",
    )
    for field in dataclasses.fields(ServeLimits):
        parser.add_argument(
            f"--{field.name.replace('_', '-')}", type=_limit_type(field), default=field.default,
            help=f"{_LIMIT_HELP[field.name]} (default {field.default})",
        )
    return parser.parse_args(list(argv))


def _limit_type(field: dataclasses.Field) -> Callable[[str], float]:
    """A `ServeLimits` flag's type: a count is >= 1, a wait >= 0, a timeout > 0 (0 would refuse everything)."""
    if field.name == "batch_wait_ms":
        return number(float, 0)
    return POSITIVE if isinstance(field.default, int) else number(float, 0, low_open=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args([] if argv is None else argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    torch.set_num_threads(args.torch_threads)
    if not _is_loopback(args.host) and not args.api_key:
        log.warning("serving on %s without an API key: anyone who can reach it can use it", args.host)
    app = app_from_args(args)
    log.info("serving %s as %r on http://%s:%d/v1", args.model, app.state.model_name, args.host, args.port)
    uvicorn.run(
        app, host=args.host, port=args.port, log_level=args.log_level, timeout_graceful_shutdown=30,
        timeout_keep_alive=args.timeout_keep_alive,
    )
    return 0


def app_from_args(args: argparse.Namespace) -> FastAPI:
    """The app the flags describe: the engine loaded, its chat template, sessions and tool parser set."""
    limits = ServeLimits(**{f.name: getattr(args, f.name) for f in dataclasses.fields(ServeLimits)})
    try:
        engine = load_engine(args)
    except (ModelNotFoundError, ValueError, ImportError) as err:  # no such folder (or adapter base); no chat template; no peft
        raise SystemExit(f"error: {err}") from None
    if args.chat_template:
        try:
            engine.tokenizer.chat_template = Path(args.chat_template).expanduser().read_text()
        except OSError as err:
            raise SystemExit(f"error: --chat-template {args.chat_template}: {err.strerror}") from None
    name = args.served_model_name or args.model
    aliases = [args.model, str(Path(args.model).expanduser().resolve()), Path(args.model).name]
    sessions = SessionStore(engine.tokenizer, engine.eos_token_ids, args.max_sessions) if args.sessions else None
    tool_parser = TOOL_CALL_PARSERS[args.tool_call_parser]() if args.tool_call_parser else None
    app = build_app(engine, name, limits, api_key=args.api_key, model_aliases=aliases, sessions=sessions,
                    tool_parser=tool_parser)
    app.state.model_name = name
    if sessions is not None:
        app.state.on_shutdown.append(lambda: log_lost_sessions(sessions))
    return app


def log_lost_sessions(sessions: SessionStore) -> None:
    """Sessions live in the server's memory only: say what stopping it loses (SIGTERM runs this too)."""
    held, trajectories = sessions.held()
    if held:
        log.warning("gateway: %d session(s) holding %d trajectories lived in this server's memory only and are lost "
                    "at shutdown (fetch GET /sessions/ID before stopping the server)", held, trajectories)
    else:
        log.info("gateway: no session held at shutdown")


def load_engine(args: argparse.Namespace):
    """The rollout engine `args` ask for, built from the model folder (rlhf.rollout.engine)."""
    factory = engine_class(args.engine)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    log.info("rollout engine: %s", factory.__name__)
    if factory is VLLMEngine:
        return factory(args.model, dtype=args.dtype, gpu_memory_utilization=args.gpu_memory_utilization,
                       max_model_len=args.max_model_len)
    return factory(args.model, dtype=args.dtype, device=device)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class BackgroundServer:
    """Run an app with uvicorn in a daemon thread on a free loopback port (tests and benchmarks).

    with BackgroundServer(app) as server:
        OpenAI(base_url=server.url + "/v1", api_key="...")
    """

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", log_level: str = "warning"):
        self.app, self.host, self.log_level = app, host, log_level
        self.port = 0
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def __enter__(self) -> BackgroundServer:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind((self.host, 0))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            self.app, log_level=self.log_level, timeout_graceful_shutdown=10, timeout_keep_alive=KEEP_ALIVE_S
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name="rlhf-serve-uvicorn", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + 60
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start (see its log above)")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=30)
