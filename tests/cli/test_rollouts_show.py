"""`rlhf rollouts show STAGE_DIR` prints one summary line per step (a long run records thousands of
groups: the main job's 16,001 lines); `--step N` prints that step's groups, best and worst response."""

import json

from rlhf.cli import main
from rlhf.trainers.records import RECORDS_FILE


def _records(folder, steps=40):
    """`steps` steps x 2 groups x 2 responses: scores 0 and 1 (mean 0.5), lengths 4 and 6 + step (mean 5 + step)."""
    rows = [{"step": step, "uid": f"g{g}", "prompt": f"What is {g}+{step}?", "response": f"answer {step}-{g}-{i}",
             "score": float(i), "advantage": i - 0.5, "response_length": 4 + 2 * i + step, "ground_truth": "4",
             "data_source": "arithmetic"}
            for step in range(1, steps + 1) for g in range(2) for i in range(2)]
    (folder / RECORDS_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_show_without_a_step_prints_one_line_per_step(tmp_path, capsys):
    _records(tmp_path)
    assert main(["rollouts", "show", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["step", "rows", "mean", "score", "mean", "length", "first", "response"]
    assert len(lines) == 1 + 40 + 2  # the header, a line per step, a blank line and how to see one step
    # step 7: 4 rows, mean score (0 + 1 + 0 + 1) / 4 = 0.5, mean length (11 + 13 + 11 + 13) / 4 = 12.0
    assert lines[7].split() == ["7", "4", "+0.500", "12.0", "'answer", "7-0-0'"]
    assert lines[-1].endswith("--step N: the best and worst response of each group at step N")


def test_show_with_a_step_prints_its_groups_best_and_worst(tmp_path, capsys):
    _records(tmp_path)
    assert main(["rollouts", "show", str(tmp_path), "--step", "7"]) == 0
    out = capsys.readouterr().out
    assert out.count("step 7  g") == 2 and "step 8" not in out
    assert "best  score +1.000 adv +0.500: 'answer 7-1-1'" in out
    assert "worst score +0.000 adv -0.500: 'answer 7-1-0'" in out
