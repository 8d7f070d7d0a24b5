"""`rlhf generate --engine vllm` (real vLLM: the CPU build): the same rows as the transformers
engine gives, greedy."""

import json
from pathlib import Path

import pytest

from helpers import vllm_model_path
from rlhf.cli import main
from rlhf.data import arithmetic_rows, write_rows

pytestmark = pytest.mark.vllm


def test_rlhf_generate_with_vllm_writes_what_the_transformers_engine_writes(tmp_path):
    data = str(write_rows(arithmetic_rows(5, split="test"), tmp_path / "prompts.jsonl"))
    outputs = {}
    for engine in ("vllm", "hf"):
        out = tmp_path / f"{engine}.jsonl"
        assert main(["generate", vllm_model_path(), "--data", data, "--out", str(out), "--engine", engine,
                     "--local", "--quiet", "--n", "2", "--temperature", "0", "--max-new-tokens", "6",
                     "--batch-size", "2", "--max-prompt-length", "128"]) == 0
        outputs[engine] = [json.loads(line) for line in Path(out).read_text().splitlines()]
    assert len(outputs["vllm"]) == 5
    assert [r["responses"] for r in outputs["vllm"]] == [r["responses"] for r in outputs["hf"]]
    assert all(len(r["responses"]) == 2 for r in outputs["vllm"])
