"""`rlhf generate` records the dtype it computed in, so resuming an output with another `--dtype`
is refused like another temperature: bfloat16 and float32 responses must not mix in one file."""

import json
from pathlib import Path

import pytest

from helpers import tiny_model_path
from rlhf.data.files import write_rows
from rlhf.data.generators import arithmetic_rows
from rlhf.data.schema import DataError
from rlhf.runtime.experiment import run_experiment
from rlhf_configs.generate_eval import generation_experiment


def generate(data, out, **kw):
    graph = generation_experiment(tiny_model_path(), data, str(out), n=2, max_new_tokens=4, batch_size=2,
                                  local=True, progress=False, **kw)
    return run_experiment(graph)["generate"]


def test_resuming_with_another_dtype_is_refused(tmp_path):
    data = str(write_rows(arithmetic_rows(6, split="test"), tmp_path / "prompts.jsonl"))
    out = tmp_path / "gens.jsonl"
    rows = [json.loads(line) for line in Path(generate(data, out)["generations"]).read_text().splitlines()]
    assert rows[0]["generation_settings"]["dtype"] == "float32"
    out.write_text("".join(json.dumps(r) + "\n" for r in rows[:3]))  # an interrupted job: 3 rows written
    with pytest.raises(DataError, match=r"dtype='float32'.*this job has dtype='bfloat16'"):
        generate(data, out, dtype="bfloat16")
    assert len(out.read_text().splitlines()) == 3  # nothing appended
