"""`rlhf sft MODEL --data FILE ...`: builds the SFT graph and trains, in process with --local."""

import json

import pytest
import torch

from rlhf.cli import main
from rlhf.data.files import write_rows
from rlhf.data.generators import arithmetic_rows
from rlhf.models.loading import load_causal_lm
from helpers import tiny_model_path


def test_rlhf_sft_trains_on_prompt_rows_with_val_loss_and_accuracy(tmp_path, capsys):
    write_rows(arithmetic_rows(8), tmp_path / "train.jsonl")
    write_rows(arithmetic_rows(4, split="test"), tmp_path / "val.jsonl")
    code = main(["sft", tiny_model_path(), "--data", str(tmp_path / "train.jsonl"),
                 "--val", str(tmp_path / "val.jsonl"),
                 "--steps", "2", "--batch-size", "4", "--micro-batch-size", "2", "--lr", "1e-3", "--accuracy",
                 "--max-new-tokens", "4", "--out", str(tmp_path / "out"), "--local", "--quiet"])
    out = capsys.readouterr().out
    assert code == 0
    assert "val/sft_loss" in out and "val-core/arithmetic/reward/mean@1" in out
    checkpoint = out.split("checkpoint: ")[1].split()[0]
    assert checkpoint.endswith("sft/final")
    trained = load_causal_lm(checkpoint, "float32").state_dict()
    initial = load_causal_lm(tiny_model_path(), "float32").state_dict()
    assert trained.keys() == initial.keys()
    assert any(not torch.equal(trained[k], initial[k]) for k in trained)  # the trained weights, not the initial ones


def test_rlhf_sft_reads_chat_rows(tmp_path, capsys):
    chat = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    (tmp_path / "chat.jsonl").write_text("\n".join(json.dumps(chat) for _ in range(4)))
    main(["sft", tiny_model_path(), "--data", str(tmp_path / "chat.jsonl"), "--steps", "1", "--batch-size", "2",
          "--out", str(tmp_path / "out"), "--local", "--quiet"])
    assert "checkpoint: " in capsys.readouterr().out


def test_rlhf_sft_reports_a_missing_file(tmp_path):
    with pytest.raises(SystemExit, match="no such data file"):
        main(["sft", tiny_model_path(), "--data", str(tmp_path / "nope.jsonl"), "--local", "--quiet"])
