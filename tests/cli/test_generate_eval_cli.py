"""`rlhf generate` / `rlhf eval` from the command line: bad numbers and unknown data sources fail in one
line before any model loads; `--scorer module:function` (a file beside the data) and `--limit` work."""

import json
import time
from pathlib import Path

import pytest
from helpers import tiny_model_path

from rlhf.cli import main
from rlhf.data import arithmetic_rows, write_rows

MISSING_MODEL = "/nonexistent/model"  # loading it would fail with another message: the checks come first


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> str:
    return str(write_rows(arithmetic_rows(6, split="test"), tmp_path_factory.mktemp("data") / "prompts.jsonl"))


def fails(argv, capsys) -> str:
    """The one-line error `argv` exits with, after checking it came fast (no model, no Ray)."""
    capsys.readouterr()
    start = time.monotonic()
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert time.monotonic() - start < 10
    message = str(exit_info.value.code) if exit_info.value.code not in (None, 2) else capsys.readouterr().err
    lines = message.strip().splitlines()
    assert len(lines) == 1, message
    return lines[0]


@pytest.mark.parametrize("flag,value,expected", [
    ("--batch-size", "0", "argument --batch-size: must be >= 1, got 0"),
    ("--n", "-2", "argument --n: must be >= 1, got -2"),
    ("--max-new-tokens", "ten", "argument --max-new-tokens: expected an integer, got 'ten'"),
    ("--limit", "0", "argument --limit: must be >= 1, got 0"),
    ("--temperature", "-0.1", "argument --temperature: must be >= 0, got -0.1"),
    ("--top-p", "0", "argument --top-p: must be > 0 and <= 1, got 0"),
    ("--top-p", "1.5", "argument --top-p: must be > 0 and <= 1, got 1.5"),
    ("--workers", "0", "argument --workers: must be >= 1, got 0"),
    ("--max-prompt-length", "0", "argument --max-prompt-length: must be >= 1, got 0"),
    ("--dtype", "float8", "argument --dtype: invalid choice: 'float8'"),
])
@pytest.mark.parametrize("command", ["generate", "eval"])
def test_bad_numbers_fail_in_one_line_before_anything_loads(tmp_path, data, capsys, command, flag, value, expected):
    argv = [command, MISSING_MODEL, "--data", data, flag, value] + (["--out", str(tmp_path / "g.jsonl")]
                                                                     if command == "generate" else [])
    line = fails(argv, capsys)
    assert line.startswith(f"rlhf {command}: error: ") and expected in line


def test_an_unknown_data_source_names_the_fix_before_any_model_loads(tmp_path, capsys):
    rows = [{**r, "data_source": "my/task"} for r in arithmetic_rows(3, split="test")]
    path = str(write_rows(rows, tmp_path / "mine.jsonl"))
    line = fails(["eval", MISSING_MODEL, "--data", path, "--local"], capsys)
    assert line.startswith("error: no reward scorer for data_source 'my/task'") and "--scorer" in line
    generations = tmp_path / "gens.jsonl"
    generations.write_text("".join(json.dumps({**r, "responses": ["1"]}) + "\n" for r in rows))
    assert "my/task" in fails(["eval", "--generations", str(generations)], capsys)
    line = fails(["eval", MISSING_MODEL, "--data", path, "--scorer", "nope_module_x:score"], capsys)
    assert "cannot import module 'nope_module_x'" in line
    line = fails(["eval", MISSING_MODEL, "--data", str(tmp_path / "absent.jsonl")], capsys)
    assert line.startswith("error: ") and "absent.jsonl" in line


SCORER = '''
def last_number(response, ground_truth, extra_info=None):
    """1 when the last number in the response is the answer."""
    import re
    numbers = re.findall(r"-?\\d+", response)
    return {"score": float(bool(numbers) and numbers[-1] == ground_truth), "numbers": len(numbers)}


def always_one(response, ground_truth, extra_info=None):
    return 1.0
'''


def test_a_scorer_in_a_file_beside_the_data_scores_eval_and_generate(tmp_path, data, monkeypatch, capsys):
    (tmp_path / "my_rewards.py").write_text(SCORER)
    monkeypatch.chdir(tmp_path)  # `rlhf` imports the scorer's module from the current folder
    rows = [{**r, "data_source": "my/task"} for r in arithmetic_rows(6, split="test")]
    mine = str(write_rows(rows, tmp_path / "mine.jsonl"))
    common = ["--n", "2", "--max-new-tokens", "3", "--local", "--quiet", "--limit", "4"]
    assert main(["eval", tiny_model_path(), "--data", mine, "--out", str(tmp_path / "ev"),
                 "--scorer", "my_rewards:always_one", "--ks", "1,2", *common]) == 0
    report = json.loads((tmp_path / "ev" / "eval_results.json").read_text())
    assert report["sources"]["my/task"]["prompts"] == 4  # --limit 4 of 6
    assert report["metrics"]["val-core/my/task/reward/mean@2"] == 1.0
    assert main(["eval", "--generations", str(tmp_path / "ev" / "generations.jsonl"),
                 "--scorer", "my/task=my_rewards:last_number", "--ks", "1", "--out", str(tmp_path / "ev2")]) == 0
    capsys.readouterr()
    assert main(["generate", tiny_model_path(), "--data", data, "--out", str(tmp_path / "g.jsonl"),
                 "--scorer", "my_rewards:last_number", *common]) == 0
    assert "mean score:" in capsys.readouterr().out
    out = [json.loads(line) for line in Path(tmp_path / "g.jsonl").read_text().splitlines()]
    assert len(out) == 4 and all(len(r["scores"]) == 2 for r in out)


@pytest.mark.real_model
def test_rlhf_eval_and_generate_on_smollm2_with_a_scorer_and_limit_finish_quickly(smollm2_path, tmp_path, monkeypatch,
                                                                                    capsys):
    """The real model through both commands, with a scorer from a file beside the data and --limit: a few prompts
    take seconds (each row stops costing when it ends), not the minutes a whole file would."""
    (tmp_path / "my_rewards.py").write_text(SCORER)
    monkeypatch.chdir(tmp_path)
    data = str(write_rows(arithmetic_rows(50, split="test"), tmp_path / "test.jsonl"))
    start = time.monotonic()
    assert main(["eval", smollm2_path, "--data", data, "--limit", "4", "--n", "2", "--temperature", "0",
                 "--max-new-tokens", "96", "--scorer", "my_rewards:last_number", "--local", "--quiet",
                 "--out", str(tmp_path / "ev")]) == 0
    report = json.loads((tmp_path / "ev" / "eval_results.json").read_text())
    rows = [json.loads(line) for line in (tmp_path / "ev" / "generations.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and report["sources"]["arithmetic"]["prompts"] == 4
    import my_rewards

    expected = sum(my_rewards.last_number(t, r["reward_model"]["ground_truth"])["score"]
                   for r in rows for t in r["responses"]) / 8
    assert report["metrics"]["val-core/arithmetic/reward/mean@2"] == pytest.approx(expected)  # the scorer's
    assert all(r["responses"][0] == r["responses"][1] for r in rows)  # greedy: both samples the same
    assert main(["generate", smollm2_path, "--data", data, "--limit", "2", "--out", str(tmp_path / "g.jsonl"),
                 "--max-new-tokens", "64", "--local", "--quiet"]) == 0
    assert len((tmp_path / "g.jsonl").read_text().splitlines()) == 2
    assert time.monotonic() - start < 300  # ~40 s on an idle core
