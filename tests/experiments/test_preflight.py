"""Bad input stops an experiment before any training, naming what is wrong and how to fix it."""

import json
import time

import fiddle as fdl
import pytest

from rlhf.cli.experiment import run_cli
from rlhf.runtime.preflight import PreflightError
from rlhf.data.sources import load_rows
from rlhf.runtime.experiment import run_experiment
from helpers import load_file


def load(name):
    return load_file(f"experiments/{name}.py")


def test_offline_gsm8k_recipe_names_the_missing_model_and_data(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    graph = load("qwen_gsm8k").base(data_dir=str(tmp_path / "gsm8k"))
    graph.output_dir = str(tmp_path / "out")
    start = time.perf_counter()
    with pytest.raises(PreflightError) as err:
        run_experiment(graph)
    message = str(err.value)
    assert time.perf_counter() - start < 15
    assert "Qwen/Qwen2.5-0.5B-Instruct" in message and "fiddler:tiny" in message
    assert "train.parquet" in message and "test.parquet" in message
    assert not (tmp_path / "out").exists()


def test_a_row_without_an_answer_fails_before_training(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    module = load("qwen_gsm8k")
    data = tmp_path / "gsm8k"
    data.mkdir()
    row = {"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": "1+1?"}],
           "reward_model": {"style": "rule", "ground_truth": "2"}}
    bad = {k: v for k, v in row.items() if k != "reward_model"}
    for split, rows in (("train", [row, bad]), ("test", [row])):
        (data / f"{split}.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    graph = module.base(data_dir=str(data))
    module.tiny(graph)  # a local model, so only the data is wrong
    graph.stages["grpo"].train_data.rows = fdl.Config(load_rows, path=str(data / "train.jsonl"))
    with pytest.raises(PreflightError, match=r"train.jsonl.*row 1.*reward_model"):
        run_experiment(graph)


def test_misspelled_fiddler_exits_with_the_valid_names(capsys):
    with pytest.raises(SystemExit) as err:
        run_cli(load("arithmetic_tiny"), ["--config", "fiddler:smokee"])
    assert "Did you mean 'smoke'?" in str(err.value)


def test_unknown_field_exits_with_did_you_mean():
    with pytest.raises(SystemExit) as err:
        run_cli(load("arithmetic_tiny"), ["--config", "set:stages.grpo.total_stepz=3"])
    assert "Did you mean 'total_steps'?" in str(err.value)


def test_an_unknown_data_source_fails_before_any_model_loads(tmp_path, monkeypatch):
    """Training rows of a data_source the reward has no scorer for: it used to be a raw traceback after the
    models loaded (the trainer checks when it is built)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    module = load("qwen_gsm8k")
    row = {"data_source": "mystery/source", "prompt": [{"role": "user", "content": "1+1?"}],
           "reward_model": {"style": "rule", "ground_truth": "2"}}
    (tmp_path / "train.jsonl").write_text(json.dumps(row) + "\n")
    graph = module.base(data_dir=str(tmp_path))
    module.tiny(graph)
    graph.output_dir = str(tmp_path / "out")
    graph.stages["grpo"].train_data.rows = fdl.Config(load_rows, path=str(tmp_path / "train.jsonl"))
    with pytest.raises(PreflightError) as err:
        run_experiment(graph)
    message = str(err.value)
    assert "stages.grpo.train_data: no reward scorer for data_source 'mystery/source'" in message
    assert "Fix: add the missing source" in message
    assert not (tmp_path / "out").exists()  # nothing started
