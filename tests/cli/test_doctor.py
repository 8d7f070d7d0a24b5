"""`rlhf doctor` prints what a bug report needs, read from this installation (not hard-coded)."""

import json
import subprocess
import sys
from pathlib import Path

import torch
import transformers

ROOT = Path(__file__).resolve().parents[2]


def _doctor(*args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "rlhf.cli", "doctor", *args], capture_output=True, text=True,
                          cwd=ROOT, env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "RLHF_CACHE": "/tmp/x"})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_block_names_versions_commit_and_picks():
    text = _doctor()
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    assert text.startswith("rlhf doctor")
    assert f"commit {head}" in text
    assert f"torch {torch.__version__}" in text and f"transformers {transformers.__version__}" in text
    picks = next(line for line in text.splitlines() if line.startswith("picks"))
    want = ("fsdp", "gloo") if torch.cuda.is_available() else ("ddp", "hf", "gloo")
    assert all(w in picks for w in want), picks
    assert "RLHF_CACHE=/tmp/x" in text  # the environment variables that change behaviour are shown


def test_json_is_the_same_report():
    info = json.loads(_doctor("--json"))
    assert info["packages"]["torch"] == torch.__version__.split("+")[0] or info["packages"]["torch"] == torch.__version__
    assert info["picks"]["engine"].startswith("auto -> ")
    assert info["environment"] == {"RLHF_CACHE": "/tmp/x", "OMP_NUM_THREADS": "1"}
