"""Rollout records: sampled per step, truncated on resume, shown best/worst per group."""

import pytest
import torch

from rlhf.batch import Batch
from rlhf.trainers.records import RolloutRecorder, format_records, read_records, truncate_records


def scored_batch():
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0]])
    scores = torch.zeros(4, 3)
    scores[1, 2] = 1.0
    return Batch(
        {"response_mask": mask, "token_level_scores": scores, "advantages": torch.tensor([[-0.5] * 3, [1.5] * 3, [0.2] * 3, [0.1] * 3]) * mask},
        {"uid": ["a", "a", "b", "b"], "ground_truth": ["7", "7", "9", "9"], "data_source": ["arithmetic"] * 4},
    )


def test_records_round_trip_and_show_best_and_worst(tmp_path):
    rec = RolloutRecorder()
    for step in (1, 2, 3):
        rec.write(tmp_path, step, scored_batch(), ["6", "7", "9", "8"], ["p1", "p1", "p2", "p2"])
    rows = read_records(tmp_path, step=2)
    assert len(rows) == 4 and {r["step"] for r in rows} == {2}
    text = format_records([r for r in rows if r["uid"] == "a"])
    assert "best  score +1.000 adv +1.500: '7'" in text and "worst score +0.000 adv -0.500: '6'" in text
    truncate_records(tmp_path, last_step=1)
    assert {r["step"] for r in read_records(tmp_path)} == {1}


def test_sample_rate_records_whole_groups():
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        written = sum(RolloutRecorder(sample_rate=0.5, seed=1).write(Path(d), s, scored_batch(), ["x"] * 4, ["p"] * 4) for s in range(20))
        rows = read_records(Path(d))
    assert 0 < written < 80 and written % 2 == 0  # groups of 2 are kept or dropped together
    assert all(sum(1 for r in rows if (r["step"], r["uid"]) == (s, u)) == 2 for s, u in {(r["step"], r["uid"]) for r in rows})


def test_a_torn_last_line_is_dropped_with_a_warning_on_resume_and_on_reading(tmp_path, caplog):
    """A kill (or a full disk) in the middle of an append leaves half a line: resuming used to stop at a raw
    JSONDecodeError on every later attempt."""
    rec = RolloutRecorder()
    for step in (1, 2):
        rec.write(tmp_path, step, scored_batch(), ["6", "7", "9", "8"], ["p1", "p1", "p2", "p2"])
    path = tmp_path / "rollouts.jsonl"
    path.write_bytes(path.read_bytes() + b'{"step": 3, "uid": "a", "prom')
    assert {r["step"] for r in read_records(tmp_path)} == {1, 2}
    assert "line 9 is cut short" in caplog.text
    truncate_records(tmp_path, last_step=2)  # what a resume from checkpoint 2 does
    assert path.read_text().endswith("}\n") and len(read_records(tmp_path)) == 8
    rec.write(tmp_path, 3, scored_batch(), ["6", "7", "9", "8"], ["p1", "p1", "p2", "p2"])
    assert [r["step"] for r in read_records(tmp_path)] == [1] * 4 + [2] * 4 + [3] * 4


def test_a_bad_line_before_the_end_names_the_file_and_line(tmp_path):
    import pytest

    RolloutRecorder().write(tmp_path, 1, scored_batch(), ["6", "7", "9", "8"], ["p1", "p1", "p2", "p2"])
    path = tmp_path / "rollouts.jsonl"
    path.write_text("garbage\n" + path.read_text())
    with pytest.raises(ValueError, match=r"rollouts.jsonl: line 1 is not a JSON record"):
        truncate_records(tmp_path, last_step=1)  # a resume; reading skips the line with a warning
    assert len(read_records(tmp_path)) == 4


def test_a_full_disk_leaves_no_half_step_in_the_records(tmp_path):
    """On a real full filesystem (a small tmpfs) a step's append fails part-way: the file is cut back to
    the previous step's end, so a later resume reads whole steps only."""
    import errno

    import pytest

    from helpers import fill_disk, small_disk

    with small_disk(tmp_path / "disk", size="1m") as disk:
        rec = RolloutRecorder()
        rec.write(disk, 1, scored_batch(), ["6", "7", "9", "8"], ["p1", "p1", "p2", "p2"])
        before = (disk / "rollouts.jsonl").read_bytes()
        fill_disk(disk, leave=4096)  # one page free: less than the step below
        long = ["x" * 3000] * 4
        with pytest.raises(OSError) as err:
            rec.write(disk, 2, scored_batch(), long, long)
        assert err.value.errno == errno.ENOSPC
        assert (disk / "rollouts.jsonl").read_bytes() == before
        assert {r["step"] for r in read_records(disk)} == {1}


def _groups_batch(groups: int, n: int = 2) -> Batch:
    rows = groups * n
    mask = torch.ones(rows, 2, dtype=torch.long)
    return Batch(
        {"response_mask": mask, "token_level_scores": torch.zeros(rows, 2), "advantages": torch.zeros(rows, 2)},
        {"uid": [f"g{i // n:03d}" for i in range(rows)], "ground_truth": ["1"] * rows, "data_source": ["a"] * rows},
    )


def test_groups_per_step_are_capped_whole_and_reproducibly(tmp_path):
    batch = _groups_batch(40)
    rec = RolloutRecorder(max_groups_per_step=16, seed=3)
    assert rec.write(tmp_path / "a", 5, batch, ["x"] * 80, ["p"] * 80) == 32  # 16 whole groups of 2
    rec.write(tmp_path / "b", 5, batch, ["x"] * 80, ["p"] * 80)
    a, b = read_records(tmp_path / "a"), read_records(tmp_path / "b")
    assert [r["uid"] for r in a] == [r["uid"] for r in b]  # the same draw for the same seed and step
    assert len({r["uid"] for r in a}) == 16
    assert RolloutRecorder(max_groups_per_step=None).write(tmp_path / "c", 5, batch, ["x"] * 80, ["p"] * 80) == 80


def test_multi_turn_rows_are_shown_as_trained_and_context_spans(tmp_path):
    """A multi-turn response is recorded as runs of sampled (trained) and shown (context) tokens."""
    from helpers import tiny_model_path
    from rlhf.models.loading import load_tokenizer

    tok = load_tokenizer(tiny_model_path())
    sampled = tok("add(1, 2)<|im_end|>")["input_ids"]
    shown = tok("\n<|im_start|>tool\n3<|im_end|>\n<|im_start|>assistant\n")["input_ids"]
    answer = tok("3<|im_end|>")["input_ids"]
    response = sampled + shown + answer
    mask = [1] * len(sampled) + [0] * len(shown) + [1] * len(answer)
    width = len(response) + 2
    responses = torch.full((2, width), tok.pad_token_id)
    responses[0, : len(response)] = torch.tensor(response)
    responses[1, :2] = torch.tensor(answer)
    response_mask = torch.zeros(2, width, dtype=torch.long)
    response_mask[0, : len(mask)] = torch.tensor(mask)
    response_mask[1, :2] = 1
    attention = torch.cat([torch.ones(2, 3, dtype=torch.long), (responses != tok.pad_token_id).long()], dim=1)
    batch = Batch(
        {"responses": responses, "response_mask": response_mask, "attention_mask": attention,
         "token_level_scores": torch.zeros(2, width), "advantages": torch.zeros(2, width)},
        {"uid": ["a", "a"], "ground_truth": ["3", "3"], "data_source": ["calc"] * 2,
         "extra_info": [{"agent": {"num_turns": 2, "finish_reason": "done"}}, {}]},
    )
    RolloutRecorder().write(tmp_path, 1, batch, ["3", "3"], ["p", "p"], tok)
    rows = read_records(tmp_path)
    assert rows[0]["segments"] == [
        {"text": "add(1, 2)<|im_end|>", "trained": True},
        {"text": "\n<|im_start|>tool\n3<|im_end|>\n<|im_start|>assistant\n", "trained": False},
        {"text": "3<|im_end|>", "trained": True}]
    assert "segments" not in rows[1]  # a single-turn response has nothing to tell apart
    text = format_records(rows)
    assert "2 turns, done:" in text
    assert "      trained | 'add(1, 2)<|im_end|>'" in text
    assert "      context | '\\n<|im_start|>tool\\n3<|im_end|>\\n<|im_start|>assistant\\n'" in text


def test_prompts_are_decoded_for_the_recorded_rows_only(tmp_path):
    asked = []

    def prompts(rows):
        asked.append(rows)
        return [f"prompt {i}" for i in rows]

    assert RolloutRecorder(max_groups_per_step=1, seed=0).write(tmp_path, 1, scored_batch(), ["6", "7", "9", "8"], prompts) == 2
    rows = read_records(tmp_path)
    assert len(asked) == 1 and asked[0] in ([0, 1], [2, 3])  # one group of two, asked for once
    assert [r["prompt"] for r in rows] == [f"prompt {i}" for i in asked[0]]
    assert [r["response"] for r in rows] == [["6", "7", "9", "8"][i] for i in asked[0]]
    assert [r["advantage"] for r in rows] == pytest.approx([-0.5, 1.5] if asked[0] == [0, 1] else [0.2, 0.1])


def test_each_records_reward_parts_are_kept(tmp_path):
    """A scorer's extra values and a reward model's share of the score are in the record of each row they were
    reported for (docs/rewards.md), as JSON numbers; rows a scorer left out carry none; `show` prints the parts."""
    import numpy as np

    batch = scored_batch()
    batch["reward_extra/lenient"] = [1.0, np.float32(0.5), None, True]
    batch["reward_extra/rule/score"] = [0.0, 1.0, 0.0, 0.0]
    batch["reward_extra/model/score"] = [-0.25, 0.125, 2.0, 0.0]
    RolloutRecorder().write(tmp_path, 1, batch, ["6", "7", "9", "8"], ["p1", "p1", "p2", "p2"])
    rows = read_records(tmp_path)
    assert [r["reward_extra"] for r in rows] == [
        {"lenient": 1.0, "rule/score": 0.0, "model/score": -0.25},
        {"lenient": 0.5, "rule/score": 1.0, "model/score": 0.125},
        {"rule/score": 0.0, "model/score": 2.0},
        {"lenient": True, "rule/score": 0.0, "model/score": 0.0},
    ]
    assert "best  score +1.000 (rule +1.000, model +0.125) adv +1.500: '7'" in format_records(rows[:2])
    RolloutRecorder().write(tmp_path / "plain", 1, scored_batch(), ["6", "7", "9", "8"], ["p1", "p1", "p2", "p2"])
    assert all("reward_extra" not in r for r in read_records(tmp_path / "plain"))
