"""`rlhf serve` and `rlhf plan --memory` check their flags and input: a bad value is one line and
exit status 2, before any model loads or server starts (it was a 500 on every session request, a 400
on every request, a traceback, a ZeroDivisionError, or a plan for -1 GB)."""

import time
from pathlib import Path

import pytest

from rlhf.cli import main

ROOT = Path(__file__).parents[2]
CONFIG = str(ROOT / "rlhf_configs" / "model_configs" / "qwen2.5-0.5b.json")


def fails(argv, capsys) -> str:
    capsys.readouterr()
    start = time.monotonic()
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert time.monotonic() - start < 10
    assert exit_info.value.code == 2, exit_info.value.code
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


@pytest.mark.parametrize("flag, value, expected", [
    ("--max-sessions", "0", "argument --max-sessions: must be >= 1, got 0"),
    ("--max-batch-size", "0", "argument --max-batch-size: must be >= 1, got 0"),
    ("--torch-threads", "0", "argument --torch-threads: must be >= 1, got 0"),
    ("--max-queue", "-1", "argument --max-queue: must be >= 1, got -1"),
    ("--queue-timeout-s", "0", "argument --queue-timeout-s: must be > 0, got 0"),
    ("--batch-wait-ms", "-5", "argument --batch-wait-ms: must be >= 0, got -5"),
    ("--gpu-memory-utilization", "1.5", "argument --gpu-memory-utilization: must be > 0 and <= 1, got 1.5"),
    ("--port", "70000", "argument --port: must be >= 0 and <= 65535, got 70000"),
])
def test_serve_refuses_a_bad_flag_in_one_line(capsys, flag, value, expected):
    line = fails(["serve", "/nonexistent/model", flag, value], capsys)  # refused before the model is looked at
    assert line.startswith("rlhf serve: error: ") and expected in line


@pytest.mark.parametrize("flags, expected", [
    (["--gpus", "0"], "argument --gpus: must be >= 1, got 0"),
    (["--gpu-memory", "-1"], "argument --gpu-memory: must be > 0, got -1"),
    (["--prompts", "0"], "argument --prompts: must be >= 1, got 0"),
    (["--n", "0"], "argument --n: must be >= 1, got 0"),
    (["--response-tokens", "ten"], "argument --response-tokens: expected an integer, got 'ten'"),
])
def test_plan_memory_refuses_a_bad_number_in_one_line(capsys, flags, expected):
    line = fails(["plan", "--memory", CONFIG, *flags], capsys)
    assert line.startswith("rlhf plan --memory: error: ") and expected in line


def test_plan_memory_refuses_a_missing_or_non_model_config_in_one_line(capsys, tmp_path):
    line = fails(["plan", "--memory", str(tmp_path / "absent.json")], capsys)
    assert "absent.json" in line and "no such file" in line
    other = tmp_path / "package.json"
    other.write_text('{"name": "not a model"}')
    line = fails(["plan", "--memory", str(other)], capsys)
    assert "package.json" in line and "not a model config" in line
    broken = tmp_path / "config.json"
    broken.write_text("{not json")
    assert "config.json" in fails(["plan", "--memory", str(broken)], capsys)
