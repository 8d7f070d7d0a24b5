"""`rlhf rollouts show` reads past a damaged line in the middle of the records (a hand edit, a bad
copy): it skips that line with one warning naming it and shows the rest. A resume, which rewrites
the file, still refuses it, naming the line."""

import logging

import pytest
import torch

from rlhf.batch import Batch
from rlhf.cli import main
from rlhf.trainers.records import RolloutRecorder, truncate_records


def record_steps(folder, steps=(1, 2, 3)):
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    scores = torch.zeros(2, 3)
    scores[1, 2] = 1.0
    batch = Batch({"response_mask": mask, "token_level_scores": scores, "advantages": torch.ones(2, 3) * mask},
                  {"uid": ["a", "a"], "ground_truth": ["7", "7"], "data_source": ["arithmetic"] * 2})
    for step in steps:
        RolloutRecorder().write(folder, step, batch, [f"answer {step}", "7"], ["p1", "p1"])
    return folder / "rollouts.jsonl"


def test_rollouts_show_skips_a_bad_line_mid_file_with_a_warning_naming_it(tmp_path, capsys, caplog):
    path = record_steps(tmp_path)
    lines = path.read_text().splitlines()
    lines[2] = lines[2][:40] + "#garbage"  # line 3 of 6: step 2's first record
    path.write_text("\n".join(lines) + "\n")
    with caplog.at_level(logging.WARNING):
        assert main(["rollouts", "show", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "answer 1" in out and "answer 3" in out and "answer 2" not in out  # the rest is shown
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and f"{path}: line 3 is not a JSON record" in warnings[0]
    with pytest.raises(ValueError, match=r"rollouts.jsonl: line 3 is not a JSON record"):
        truncate_records(tmp_path, last_step=2)  # a resume does not silently drop a damaged record
