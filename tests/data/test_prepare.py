"""`rlhf data prepare`: generated tasks, verl's GSM8K/MATH conversion, local files, and offline messages."""

import json
import sys
import types

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlhf.data import DataError, ground_truth, read_rows
from rlhf.data.prepare import gsm8k_row_from_hf, main, math_row_from_hf
from rlhf.rewards import gsm8k_score, math_score

# The first openai/gsm8k train example, verbatim.
NATALIA = {
    "question": "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?",
    "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips "
    "altogether in April and May.\n#### 72",
}
BIG = {"question": "How many?", "answer": "It is 1000+234 = <<1000+234=1234>>1,234.\n#### 1,234"}
MATH = {"problem": "What is $1+1$?", "solution": "We add: $1+1=\\boxed{2}$.", "level": "Level 1", "type": "Algebra"}


def test_gsm8k_row_is_verls():
    row = gsm8k_row_from_hf(NATALIA, "train", 0)
    assert row == {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": NATALIA["question"]
                    + ' Let\'s think step by step and output the final answer after "####".'}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "72"},
        "extra_info": {"split": "train", "index": 0, "answer": NATALIA["answer"], "question": NATALIA["question"]},
    }
    assert gsm8k_row_from_hf(BIG, "test", 5)["reward_model"]["ground_truth"] == "1234"  # commas removed
    assert gsm8k_score(NATALIA["answer"], ground_truth(row)) == 1.0


def test_gsm8k_row_without_final_answer():
    with pytest.raises(DataError, match=r"openai/gsm8k test row 3: the answer has no final '#### <number>'"):
        gsm8k_row_from_hf({"question": "q", "answer": "no marker"}, "test", 3)


def test_math_row_is_verls():
    row = math_row_from_hf(MATH, "test", 2)
    assert row == {
        "data_source": "DigitalLearningGmbH/MATH-lighteval",
        "prompt": [{"role": "user", "content": "What is $1+1$? Let's think step by step and output the final "
                    "answer within \\boxed{}."}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "2"},
        "extra_info": {"split": "test", "index": 2},
    }
    assert math_score(MATH["solution"], "2") == 1.0
    assert math_row_from_hf({"problem": "p", "solution": "no box"}, "train", 0) is None


@pytest.mark.parametrize("task, source", [("arithmetic", "arithmetic"), ("countdown", "countdown"),
                                          ("gsm8k_synthetic", "openai/gsm8k")])
def test_generated_tasks(tmp_path, capsys, task, source):
    assert main([task, "--out", str(tmp_path), "--n", "30", "--n-test", "7", "--seed", "3"]) == 0
    train, _ = read_rows(tmp_path / "train.parquet")
    test, _ = read_rows(tmp_path / "test.parquet")
    assert (len(train), len(test)) == (30, 7)
    assert {r["data_source"] for r in train + test} == {source}
    assert {r["extra_info"]["split"] for r in test} == {"test"}
    assert not {json.dumps(r["prompt"]) for r in train} & {json.dumps(r["prompt"]) for r in test}
    assert "wrote 30 rows" in capsys.readouterr().out
    again = tmp_path / "again"
    assert main([task, "--out", str(again), "--n", "30", "--n-test", "7", "--seed", "3"]) == 0
    assert read_rows(again / "train.parquet")[0] == train  # deterministic per seed


def test_generated_defaults(tmp_path):
    assert main(["arithmetic", "--out", str(tmp_path)]) == 0
    assert len(read_rows(tmp_path / "train.parquet")[0]) == 1000
    assert len(read_rows(tmp_path / "test.parquet")[0]) == 100


def _write_hub_layout(root, examples_by_split):
    """Files laid out as the hub stores openai/gsm8k: main/<split>-00000-of-00001.parquet."""
    (root / "main").mkdir(parents=True)
    for split, examples in examples_by_split.items():
        pq.write_table(pa.Table.from_pylist(examples), root / "main" / f"{split}-00000-of-00001.parquet")


def test_gsm8k_from_local_files(tmp_path, capsys):
    _write_hub_layout(tmp_path / "raw", {"train": [NATALIA, BIG, NATALIA], "test": [BIG]})
    out = tmp_path / "out"
    assert main(["gsm8k", "--out", str(out), "--local", str(tmp_path / "raw"), "--n", "2"]) == 0
    train, _ = read_rows(out / "train.parquet")
    test, _ = read_rows(out / "test.parquet")
    assert train == [gsm8k_row_from_hf(NATALIA, "train", 0), gsm8k_row_from_hf(BIG, "train", 1)]
    assert test == [gsm8k_row_from_hf(BIG, "test", 0)]
    assert [gsm8k_score(r["extra_info"]["answer"], ground_truth(r)) for r in train + test] == [1.0] * 3


def test_math_from_local_jsonl_drops_unanswered(tmp_path, capsys):
    raw = tmp_path / "raw"
    raw.mkdir()
    for split in ("train", "test"):
        lines = [MATH, {"problem": "p", "solution": "no box"}]
        (raw / f"{split}.jsonl").write_text("\n".join(json.dumps(e) for e in lines) + "\n")
    assert main(["math", "--out", str(tmp_path / "out"), "--local", str(raw)]) == 0
    assert read_rows(tmp_path / "out" / "train.parquet")[0] == [math_row_from_hf(MATH, "train", 0)]
    assert "dropped 1 without an answer" in capsys.readouterr().out


def test_local_path_without_the_split(tmp_path, capsys):
    (tmp_path / "train.jsonl").write_text(json.dumps(NATALIA) + "\n")
    assert main(["gsm8k", "--out", str(tmp_path / "out"), "--local", str(tmp_path)]) == 1
    assert "no test file found" in capsys.readouterr().err


def test_hub_unavailable_names_task_reason_and_alternatives(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets -> ImportError
    assert main(["gsm8k", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "rlhf data prepare gsm8k: cannot load openai/gsm8k" in err
    assert "`datasets` library is not installed" in err
    assert "rlhf data prepare gsm8k_synthetic" in err and "--local PATH" in err
    assert not (tmp_path / "train.parquet").exists()

    def offline(name, config=None):
        raise ConnectionError("Couldn't reach 'openai/gsm8k' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=offline))
    assert main(["math", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "cannot load DigitalLearningGmbH/MATH-lighteval" in err and "ConnectionError: Couldn't reach" in err


def test_hub_path_with_a_stand_in_datasets(tmp_path, monkeypatch):
    calls = []

    def load_dataset(name, config=None):
        calls.append((name, config))
        return {"train": [NATALIA, BIG], "test": [BIG]}

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    assert main(["gsm8k", "--out", str(tmp_path)]) == 0
    assert calls == [("openai/gsm8k", "main")]
    assert read_rows(tmp_path / "train.parquet")[0][1] == gsm8k_row_from_hf(BIG, "train", 1)


def test_usage_errors(tmp_path, capsys):
    assert main(["--help"]) == 0
    assert main(["nope", "--out", str(tmp_path)]) == 2
    assert main(["arithmetic"]) == 2  # --out is required
    assert main(["arithmetic", "--out", str(tmp_path), "--n", "-1"]) == 1
    assert main(["arithmetic", "--out", str(tmp_path), "--local", str(tmp_path)]) == 1
    assert main(["arithmetic", "--out", str(tmp_path), "--n-test", "5000"]) == 1  # more than the test split holds
    assert "distinct pairs" in capsys.readouterr().err
