"""`rlhf serve`: the command line, and (slow) a load test of the real server process on loopback."""

import importlib.util
from pathlib import Path

import pytest

from rlhf.cli import main as rlhf
from rlhf.serve.server import parse_args

ROOT = Path(__file__).resolve().parents[2]


def test_serve_help_lists_the_flags(capsys):
    with pytest.raises(SystemExit) as exit:
        rlhf(["serve", "--help"])
    assert exit.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--host", "--port", "--api-key", "--max-tokens-limit", "--max-queue", "--max-batch-size"):
        assert flag in out


def test_flags_and_defaults(monkeypatch):
    monkeypatch.delenv("RLHF_API_KEY", raising=False)
    args = parse_args(["some/model"])
    assert (args.host, args.port, args.api_key, args.torch_threads) == ("127.0.0.1", 8000, None, 1)
    monkeypatch.setenv("RLHF_API_KEY", "from-env")
    assert parse_args(["m"]).api_key == "from-env"
    assert parse_args(["m", "--api-key", "flag", "--max-queue", "3"]).max_queue == 3


def load_benchmark():
    pytest.importorskip("httpx")
    spec = importlib.util.spec_from_file_location("serve_load", ROOT / "benchmarks" / "serve_load.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_benchmark_only_targets_loopback():
    bench = load_benchmark()
    bench.require_loopback("http://127.0.0.1:8000")
    bench.require_loopback("http://localhost:1")
    with pytest.raises(SystemExit):
        bench.require_loopback("http://10.0.0.1:8000")
    assert bench.percentile([3.0, 1.0, 2.0, 4.0], 0.5) == 2.0 and bench.percentile([1.0, 2.0], 0.99) == 2.0


@pytest.mark.slow
def test_concurrent_load_on_the_real_server_process():
    """`rlhf serve` in a subprocess: 64 requests at once all succeed and it stays up, then stops on SIGTERM."""
    result = load_benchmark().run_benchmark(requests=64, concurrency=64, max_tokens=8, deadline_s=240)
    assert result["ok"] == 64 and result["errors"] == {} and result["unfinished"] == 0, result
    assert result["server_alive_after"] and result["batches"] < 64  # requests were batched
