"""`rlhf generate` / `rlhf eval` / `rlhf probe` from the command line: bad numbers and unknown data sources fail in one
line before any model loads; `--scorer module:function` (a file beside the data) and `--limit` work; the probe's
numbers are those of its generations file."""

import importlib.util
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


PROBE_SCORER = '''
def by_truth(response, ground_truth, extra_info=None):
    """A scorer whose verdict varies by row (the tiny model answers every prompt alike): right when the
    answer is even, leniently right also when it ends in 1 or 3; "format" when it ends in 0."""
    last = int(ground_truth) % 10
    return {"score": float(last % 2 == 0), "lenient": float(last % 2 == 0 or last in (1, 3)), "format": float(last == 0)}


def by_random_text(response, ground_truth, extra_info=None):
    """Right when the response's text has an even length: the tiny model's samples split on it."""
    return {"score": float(len(response) % 2 == 0), "lenient": float(len(response) % 3 == 0)}
'''


def test_rlhf_probe_reports_accuracy_lengths_and_budget_cuts_from_its_generations(tmp_path, monkeypatch, capsys):
    (tmp_path / "probe_rewards.py").write_text(PROBE_SCORER)
    monkeypatch.chdir(tmp_path)
    data = str(write_rows(arithmetic_rows(12, split="test"), tmp_path / "sums.parquet"))
    out = tmp_path / "probe" / "report.json"
    assert main(["probe", tiny_model_path(), "--data", data, "--limit", "10", "--max-new-tokens", "12",
                 "--budgets", "16,4,8", "--scorer", "probe_rewards:by_truth", "--local", "--quiet",
                 "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    report = json.loads(out.read_text())
    rows = [json.loads(line) for line in (tmp_path / "probe" / "report.generations.jsonl").read_text().splitlines()]
    assert report["generations"] == str(tmp_path / "probe" / "report.generations.jsonl") and len(rows) == 10
    assert all(len(r["responses"]) == 1 and r["generation_settings"]["temperature"] == 0.0 for r in rows)  # greedy
    import numpy as np
    import probe_rewards

    lengths = [r["response_lengths"][0] for r in rows]
    verdicts = [probe_rewards.by_truth(r["responses"][0], r["reward_model"]["ground_truth"]) for r in rows]
    assert report["length"] == {"median": float(np.median(lengths)), "p90": float(np.percentile(lengths, 90)),
                                "max": max(lengths), "mean": float(np.mean(lengths))}
    assert report["strict_accuracy"] == sum(v["score"] for v in verdicts) / 10
    assert report["lenient_accuracy"] == sum(v["lenient"] for v in verdicts) / 10
    assert report["format_rate"] == sum(v["format"] for v in verdicts) / 10
    assert 0 < report["strict_accuracy"] < report["lenient_accuracy"] < 1  # the scorer's verdicts vary by row
    assert [b["budget"] for b in report["budgets"]] == [4, 8, 16]
    assert [b["cut"] for b in report["budgets"]] == [sum(n > b for n in lengths) / 10 for b in (4, 8, 16)]
    assert report["budgets"][2]["lower_bound"] == (max(lengths) >= 12)  # 16 is above the probe's own limit
    assert f"accuracy: strict {report['strict_accuracy']:.1%}, lenient {report['lenient_accuracy']:.1%}" in printed
    assert f"recommendation: {report['recommendation']}" in printed


def test_rlhf_probe_samples_report_pass_at_k_and_the_grpo_signal_of_its_sample_file(tmp_path, monkeypatch, capsys):
    (tmp_path / "probe_rewards.py").write_text(PROBE_SCORER)
    monkeypatch.chdir(tmp_path)
    data = str(write_rows(arithmetic_rows(12, split="test"), tmp_path / "sums.parquet"))
    out = tmp_path / "probe" / "report.json"
    assert main(["probe", tiny_model_path(), "--data", data, "--limit", "6", "--max-new-tokens", "12", "--budgets",
                 "4", "--samples", "4", "--temperature", "1.0", "--samples-max-new-tokens", "6", "--scorer",
                 "probe_rewards:by_random_text", "--local", "--quiet", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    report = json.loads(out.read_text())
    path = tmp_path / "probe" / "report.samples.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert report["samples"]["generations"] == str(path) and len(rows) == 6
    settings = rows[0]["generation_settings"]
    assert (settings["n"], settings["temperature"], settings["max_new_tokens"]) == (4, 1.0, 6)
    assert all(len(r["responses"]) == 4 and max(r["response_lengths"]) <= 6 for r in rows)
    import probe_rewards

    right = [[probe_rewards.by_random_text(text, None)["score"] >= 1 for text in r["responses"]] for r in rows]
    loose = [[probe_rewards.by_random_text(text, None)["lenient"] >= 1 for text in r["responses"]] for r in rows]
    assert report["samples"]["lenient_pass_at_k"] == sum(map(any, loose)) / 6
    assert report["samples"]["lenient_right_and_wrong"] == sum(any(r) and not all(r) for r in loose) / 6
    assert report["samples"]["accuracy"] == sum(map(sum, right)) / 24
    assert report["samples"]["pass_at_k"] == sum(map(any, right)) / 6
    assert report["samples"]["right_and_wrong"] == sum(any(r) and not all(r) for r in right) / 6
    assert 0 < report["samples"]["right_and_wrong"]  # the scorer splits a row's samples: the check can fail
    assert f"pass@4 {report['samples']['pass_at_k']:.1%}" in printed and "GRPO signal: " in printed
    assert len(json.loads((tmp_path / "probe" / "report.generations.jsonl").read_text().splitlines()[0])
               ["responses"]) == 1  # the greedy pass is unchanged beside it


@pytest.mark.skipif(importlib.util.find_spec("reasoning_gym") is None, reason="reasoning-gym is not installed")
def test_rlhf_probe_scores_reasoning_gym_rows_with_the_default_scorers(tmp_path, capsys):
    from rlhf.data.reasoning_gym import reasoning_gym_rows

    data = str(write_rows(reasoning_gym_rows("leg_counting", 3, split="test"), tmp_path / "legs.parquet"))
    assert main(["probe", tiny_model_path(), "--data", data, "--max-new-tokens", "4", "--budgets", "2",
                 "--local", "--quiet", "--out", str(tmp_path / "legs.json")]) == 0
    report = json.loads((tmp_path / "legs.json").read_text())
    assert report["lenient_reported"] and report["format_rate"] is not None  # reasoning_gym_score's extras
    assert report["by_source"]["reasoning_gym/leg_counting"]["rows"] == 3
    line = fails(["probe", MISSING_MODEL, "--data", data, "--budgets", "8,x"], capsys)
    assert "argument --budgets: expected comma-separated integers, got '8,x'" in line
    assert "argument --samples: must be >= 0, got -1" in fails(["probe", MISSING_MODEL, "--data", data, "--samples",
                                                                "-1"], capsys)
    assert "argument --temperature: must be > 0, got 0" in fails(["probe", MISSING_MODEL, "--data", data,
                                                                  "--temperature", "0"], capsys)
