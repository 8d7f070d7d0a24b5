"""Checkpoints are atomic (a failed write leaves the previous one intact) and carry a manifest:
a checkpoint broken later is set aside and resume falls back to the newest intact one."""

import errno
import hashlib
import json
import re

import pytest

from rlhf.trainers.checkpoint import MANIFEST, STATE_FILE, CheckpointError, CheckpointManager, verify


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


# --------------------------------------------------------------------------- manifest and fallback
def saved(tmp_path, steps=(1, 2, 3), keep=3):
    m = CheckpointManager(tmp_path, keep=keep)
    for step in steps:
        m.save(step, write_marker(f"w{step}"), {"kl": step})
    return m


def loader(into):
    def load(folder):
        into.append((folder.name, (folder / "weights.bin").read_text()))

    return load


def test_the_manifest_lists_every_file_with_size_and_checksum(tmp_path):
    m = saved(tmp_path, steps=(1,))
    manifest = json.loads((m.latest() / MANIFEST).read_text())
    assert sorted(manifest["files"]) == ["trainer_state.json", "weights.bin"]
    assert manifest["files"]["weights.bin"] == {"size": 2, "sha256": hashlib.sha256(b"w1").hexdigest()}
    assert verify(m.latest()) is None


@pytest.mark.parametrize(
    "damage, reason",
    [
        (lambda f: (f / "weights.bin").write_text("w"), r"weights.bin has 1 bytes, the manifest says 2"),
        (lambda f: (f / "weights.bin").write_text("xx"), r"weights.bin does not match its sha256"),
        (lambda f: (f / "weights.bin").unlink(), r"weights.bin is missing"),
        (lambda f: (f / STATE_FILE).unlink(), r"trainer_state.json is missing"),
        (lambda f: (f / MANIFEST).write_text("{"), r"MANIFEST.json is unreadable"),
        (lambda f: (f / MANIFEST).unlink(), r"has no MANIFEST.json"),
    ],
    ids=["truncated", "bit-rot", "file-deleted", "state-deleted", "manifest-garbled", "no-manifest"],
)
def test_a_broken_newest_checkpoint_falls_back_to_the_previous_one(tmp_path, caplog, damage, reason):
    m = saved(tmp_path)
    damage(tmp_path / "step_00000003")
    loaded = []
    folder, state, skipped = m.resume(loader(loaded))
    assert folder.name == "step_00000002" and state == {"kl": 2, "step": 2} and loaded == [("step_00000002", "w2")]
    (line,) = skipped
    assert re.search(rf"skipped checkpoint .*step_00000003 because .*{reason}", line), line
    assert line in caplog.text  # a warning, not a silent skip
    (aside,) = [p for p in tmp_path.iterdir() if p.name.startswith("step_00000003.broken-")]
    assert aside.name in line  # moved aside, never deleted
    m.save(3, write_marker("again"), {})  # the same step saved again leaves the broken one alone
    assert aside.exists() and [p.name for p in m.complete()] == ["step_00000001", "step_00000002", "step_00000003"]


def test_a_checkpoint_that_fails_to_load_is_skipped_too(tmp_path):
    m = saved(tmp_path)

    def load(folder):
        if folder.name == "step_00000003":
            raise RuntimeError("size mismatch for model.embed_tokens.weight\nlong trace ...")

    folder, _, skipped = m.resume(load)
    assert folder.name == "step_00000002"
    assert "loading it failed (RuntimeError: size mismatch for model.embed_tokens.weight)" in skipped[0]


def test_with_no_intact_checkpoint_the_stage_starts_over(tmp_path):
    m = saved(tmp_path, steps=(1, 2))
    for p in m.complete():
        (p / "weights.bin").write_text("zz")
    folder, state, skipped = m.resume(loader([]))
    assert folder is None and state == {"step": 0} and len(skipped) == 2
    assert len([p for p in tmp_path.iterdir() if ".broken-" in p.name]) == 2


# --------------------------------------------------------------------------- torch's own checkpoint errors
def test_torch_checkpoint_errors_are_caught_by_load_fallback_and_export(tmp_path):
    """torch.distributed.checkpoint raises `CheckpointException`, a BaseException: a checkpoint that passes its
    manifest but does not load (another model's shapes) escaped the fallback as a crash, and `rlhf export`'s
    handling. Now: skipped with DCP's first cause named, the previous checkpoint loads; export says why."""
    import pytest
    from transformers import AutoModelForCausalLM

    from helpers import tiny_model_path
    from rlhf.trainers.export import export_checkpoint
    from rlhf.workers.state_io import load_state, save_state

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path(hidden_size=32))
    other = AutoModelForCausalLM.from_pretrained(tiny_model_path(hidden_size=64))
    m = CheckpointManager(tmp_path / "checkpoints", keep=3)
    m.save(1, lambda folder: save_state(folder / "policy", model), {})
    m.save(2, lambda folder: save_state(folder / "policy", other), {})  # intact, but of another shape
    folder, _, skipped = m.resume(lambda f: load_state(f / "policy", model))
    assert folder.name == "step_00000001"
    (line,) = skipped
    assert "step_00000002 because loading it failed (CheckpointIOError: reading" in line
    assert "rank 0: ValueError: Size mismatch" in line or "rank 0: RuntimeError" in line, line

    hf = tmp_path / "mismatch" / "policy"
    save_state(hf, other)
    model.config.save_pretrained(hf / "hf")  # a config that does not match the weights
    with pytest.raises(ValueError, match="does not match its config"):
        export_checkpoint(str(tmp_path / "mismatch"), str(tmp_path / "exported"))
