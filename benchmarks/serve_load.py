"""Load-test `rlhf serve` on loopback: many concurrent chat requests, all must succeed.

    python benchmarks/serve_load.py                          # its own server on the tiny model, 200 requests at once
    python benchmarks/serve_load.py --requests 400 --concurrency 200 --max-tokens 32
    python benchmarks/serve_load.py --url http://127.0.0.1:8000 --model NAME   # a server already running

Without --url it starts `rlhf serve` as a subprocess (one torch thread) on a free
127.0.0.1 port with a tiny Qwen2 model, and stops it afterwards. Each request asks a
different arithmetic question (`POST /v1/chat/completions`, `max_tokens` tokens, sampled at
temperature 1). `--concurrency` clients send `--requests` requests in all, one at a time
each (closed loop). The run is bounded by that count and by `--deadline-s`; only loopback
addresses are accepted.
It reports requests/s, latency percentiles, errors by status, the mean rows per
`generate` batch, and whether the server still answers `/health` afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import math
import os
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from collections import Counter
from urllib.parse import urlparse

import httpx


def require_loopback(url: str) -> None:
    host = urlparse(url).hostname or ""
    loopback = host == "localhost"
    if not loopback:
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            pass
    if not loopback:
        raise SystemExit(f"refusing to load-test {url}: only loopback addresses (127.0.0.1, localhost, ::1)")


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (0..1) by the nearest-rank method."""
    ordered = sorted(values)
    return ordered[min(len(ordered), max(1, math.ceil(q * len(ordered)))) - 1]


async def load(
    url: str, model: str, requests: int, concurrency: int, max_tokens: int, deadline_s: float,
    api_key: str | None = None,
) -> dict:
    """Send `requests` chat completions from `concurrency` concurrent clients; return the measurements.

    Each client has its own one-connection httpx pool: a single pool of hundreds of
    connections spends more CPU choosing a connection than the server spends answering.
    """
    require_loopback(url)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    ssl_context = ssl.create_default_context()  # built once: each client would load the CA file again
    latencies: list[float] = []
    statuses: Counter = Counter()
    tokens = 0
    todo = iter(range(requests))

    async def client() -> None:
        nonlocal tokens
        limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        async with httpx.AsyncClient(
            base_url=url, headers=headers, limits=limits, timeout=deadline_s, verify=ssl_context
        ) as http:
            for i in todo:
                body = {
                    "model": model,
                    "messages": [{"role": "user", "content": f"What is {i % 97} + {i % 13}?"}],
                    "max_tokens": max_tokens,
                    "temperature": 1.0,
                }
                start = time.perf_counter()
                try:
                    response = await http.post("/v1/chat/completions", json=body)
                except httpx.HTTPError as err:
                    statuses[type(err).__name__] += 1
                    print(f"request {i} failed after {time.perf_counter() - start:.2f} s: {err!r}", file=sys.stderr)
                    continue
                latencies.append(time.perf_counter() - start)
                statuses[response.status_code] += 1
                if response.status_code == 200:
                    tokens += response.json()["usage"]["completion_tokens"]

    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30, verify=ssl_context) as http:
        before = (await http.get("/health")).json()
        start = time.perf_counter()
        clients = [asyncio.create_task(client()) for _ in range(concurrency)]
        _, pending = await asyncio.wait(clients, timeout=deadline_s)
        for task in pending:
            task.cancel()
        wall = time.perf_counter() - start
        try:
            after = (await http.get("/health")).json()
            alive = after.get("status") == "ok"
        except httpx.HTTPError:
            after, alive = before, False
    ok = statuses.get(200, 0)
    batches = after.get("batches", 0) - before.get("batches", 0)
    rows = after.get("rows", 0) - before.get("rows", 0)
    return {
        "requests": requests,
        "concurrency": concurrency,
        "max_tokens": max_tokens,
        "ok": ok,
        "errors": {str(k): v for k, v in statuses.items() if k != 200},
        "unfinished": requests - sum(statuses.values()),
        "wall_s": round(wall, 3),
        "requests_per_s": round(ok / wall, 2) if wall else 0.0,
        "completion_tokens_per_s": round(tokens / wall, 1) if wall else 0.0,
        "latency_p50_s": round(percentile(latencies, 0.50), 3) if latencies else None,
        "latency_p99_s": round(percentile(latencies, 0.99), 3) if latencies else None,
        "batches": batches,
        "mean_rows_per_batch": round(rows / batches, 1) if batches else None,
        "server_alive_after": alive,
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model_path: str, port: int, extra: list[str], timeout_s: float = 180) -> subprocess.Popen:
    """`rlhf serve MODEL` in a subprocess; returns once /health answers."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "rlhf.cli", "serve", model_path, "--port", str(port), "--log-level", "warning", *extra]
    proc = subprocess.Popen(cmd, env=env)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with code {proc.returncode}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.2)
    stop_server(proc)
    raise RuntimeError(f"the server did not answer /health within {timeout_s:g} s")


def stop_server(proc: subprocess.Popen) -> int:
    proc.terminate()  # SIGTERM: uvicorn finishes in-flight requests, then exits
    try:
        return proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def run_benchmark(
    requests: int = 200, concurrency: int = 200, max_tokens: int = 16, deadline_s: float = 300,
    url: str | None = None, model: str | None = None, server_args: tuple[str, ...] = (),
) -> dict:
    """Start a tiny-model server (unless `url` is given), load it, stop it; return the measurements."""
    if url is not None:
        return asyncio.run(load(url, model, requests, concurrency, max_tokens, deadline_s))
    from rlhf.models.tiny import tiny_qwen2

    root = os.environ.get("RLHF_TEST_MODELS", os.path.join(tempfile.gettempdir(), "rlhf-test-models"))
    path = tiny_qwen2(os.path.join(root, "h32-l2-s0"), hidden_size=32, num_layers=2, intermediate_size=128)
    port = free_port()
    proc = start_server(path, port, ["--max-queue", str(max(512, requests)), *server_args])
    try:
        result = asyncio.run(load(f"http://127.0.0.1:{port}", path, requests, concurrency, max_tokens, deadline_s))
        result["server_alive_after"] = result["server_alive_after"] and proc.poll() is None
    finally:
        result_code = stop_server(proc)
    result["server_exit_code"] = result_code
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=200, help="requests in all")
    parser.add_argument("--concurrency", type=int, default=200, help="requests in flight at once")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--deadline-s", type=float, default=300, help="the whole run stops after this")
    parser.add_argument("--url", help="an already running server (loopback only), e.g. http://127.0.0.1:8000")
    parser.add_argument("--model", help="the model name to send with --url")
    parser.add_argument("--server-arg", action="append", default=[], help="extra `rlhf serve` flag (repeatable)")
    args = parser.parse_args(argv)
    if args.url and not args.model:
        parser.error("--url needs --model")
    result = run_benchmark(
        args.requests, args.concurrency, args.max_tokens, args.deadline_s, args.url, args.model,
        tuple(args.server_arg),
    )
    print(json.dumps(result, indent=2))
    failed = result["errors"] or result["unfinished"] or not result["server_alive_after"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
