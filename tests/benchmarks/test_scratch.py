"""benchmarks/scratch.py: a learning benchmark's working folder keeps its logs and loses its weights."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from scratch import KEEP_ENV, prune_weights  # noqa: E402


def _workdir(root: Path) -> Path:
    run = root / "teacher" / "grpo"
    for folder in ("checkpoints/step_00000004/policy/dcp", "best", "final"):
        (run / folder).mkdir(parents=True)
    (run / "checkpoints/step_00000004/policy/dcp/__0_0.distcp").write_bytes(b"x" * 1000)
    (run / "checkpoints/step_00000004/trainer_state.json").write_text("{}")
    (run / "best/model.safetensors").write_bytes(b"y" * 500)
    (run / "best/config.json").write_text("{}")
    (run / "final/model.safetensors").write_bytes(b"z" * 250)
    (run / "rollouts.jsonl").write_text('{"prompt": "1+1"}\n')
    (root / "teacher.log").write_text("step 4\n")
    return run


def test_weights_and_checkpoint_folders_go_and_logs_stay(tmp_path, monkeypatch):
    monkeypatch.delenv(KEEP_ENV, raising=False)
    run = _workdir(tmp_path)
    assert prune_weights(tmp_path) == 1750
    assert (tmp_path / "teacher.log").read_text() == "step 4\n"
    assert (run / "rollouts.jsonl").exists()
    assert not (run / "checkpoints/step_00000004").exists()  # no half checkpoint that looks loadable
    assert not (run / "best").exists() and not (run / "final").exists()


def test_the_environment_variable_keeps_everything(tmp_path, monkeypatch):
    monkeypatch.setenv(KEEP_ENV, "1")
    run = _workdir(tmp_path)
    assert prune_weights(tmp_path) == 0
    assert (run / "best/model.safetensors").stat().st_size == 500


def test_a_missing_folder_frees_nothing(tmp_path):
    assert prune_weights(tmp_path / "absent") == 0
