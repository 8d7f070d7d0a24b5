"""Checkpoints are atomic: a failed write (e.g. a full disk) leaves the previous one intact."""

import errno

import pytest

from rlhf.trainers.checkpoint import STATE_FILE, CheckpointError, CheckpointManager


def write_marker(text):
    def write(folder):
        (folder / "weights.bin").write_text(text)

    return write


def test_keep_last_n_and_latest(tmp_path):
    m = CheckpointManager(tmp_path, keep=2)
    for step in (1, 2, 3):
        m.save(step, write_marker(f"w{step}"), {"kl": step})
    assert [p.name for p in m.complete()] == ["step_00000002", "step_00000003"]
    assert m.read_state(m.latest()) == {"kl": 3, "step": 3}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folders left


def test_disk_full_leaves_the_previous_checkpoint_intact(tmp_path):
    m = CheckpointManager(tmp_path, keep=3)
    m.save(1, write_marker("good"), {})

    def full_disk(folder):
        (folder / "weights.bin").write_text("partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(CheckpointError, match=r"No space left on device.*step_00000001 is intact"):
        m.save(2, full_disk, {})
    assert m.latest().name == "step_00000001"
    assert (m.latest() / "weights.bin").read_text() == "good"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000001"]


def test_an_incomplete_folder_is_never_taken_for_a_checkpoint(tmp_path):
    (tmp_path / "step_00000009").mkdir()  # e.g. copied by hand, no trainer state
    m = CheckpointManager(tmp_path)
    assert m.latest() is None
    m.save(3, write_marker("x"), {})
    assert m.latest().name == "step_00000003" and (m.latest() / STATE_FILE).exists()


def test_a_write_killed_midway_is_cleaned_up_on_the_next_start(tmp_path):
    m = CheckpointManager(tmp_path)
    m.save(1, write_marker("good"), {})
    (tmp_path / ".step_00000002.tmp-abc123").mkdir()  # what SIGKILL during a save leaves
    (tmp_path / ".step_00000002.tmp-abc123" / "weights.bin").write_text("partial")
    CheckpointManager(tmp_path).remove_partial()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000001"]
