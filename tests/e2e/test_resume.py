"""A run killed with SIGKILL at a random step and resumed ends bit-identical to an uninterrupted one."""

import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlhf.tracking.query import find_runs, metric_values
from rlhf.trainers.records import read_records
from helpers import tiny_model_path

JOB = Path(__file__).with_name("resume_job.py")
METRICS = ["actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "critic/score/mean", "response_length/mean"]


def job(out: Path, aim: Path, *extra: str, kill: dict[str, str] | None = None) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2]), os.environ.get("PYTHONPATH", "")])}
    env.pop("KILL_AT", None)
    env.update(kill or {})
    return subprocess.Popen(
        [sys.executable, str(JOB), tiny_model_path(), str(out), str(aim), *extra],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )


def finish(proc: subprocess.Popen) -> None:
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]


def weights(out: Path) -> dict[str, torch.Tensor]:
    return load_file(str(out / "resume" / "job" / "rl" / "final" / "model.safetensors"))


def logged(aim: Path) -> dict[str, list]:
    (run,) = find_runs(str(aim), experiment="resume")
    return {name: metric_values(str(aim), run["hash"], name) for name in METRICS}


def run_killed_then_resumed(tmp: Path, kill_at: int, mode: str, *extra: str) -> None:
    out, aim = tmp / "out", tmp / "aim"
    killed = job(out, aim, *extra, kill={"KILL_AT": str(kill_at), "KILL_MODE": mode})
    killed.communicate(timeout=600)
    assert killed.returncode == -signal.SIGKILL, f"the job was to be killed at step {kill_at}"
    finish(job(out, aim, *extra))


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted run of the same job."""
    ref = tmp_path_factory.mktemp("ref")
    finish(job(ref / "out", ref / "aim"))
    return ref


# The job has 6 steps per epoch: the second case dies right after the epoch-boundary checkpoint.
@pytest.mark.slow
@pytest.mark.parametrize(
    "kill_at, mode",
    [(random.Random().randint(1, 5), "mid_step"), (6, "after_checkpoint")],
    ids=["random_step", "epoch_boundary"],
)
def test_sigkill_and_resume_is_bit_identical(tmp_path, reference, kill_at, mode):
    run_killed_then_resumed(tmp_path / "killed", kill_at, mode)

    expected, resumed = weights(reference / "out"), weights(tmp_path / "killed" / "out")
    assert expected.keys() == resumed.keys()
    for k in expected:
        assert torch.equal(expected[k], resumed[k]), f"{k} differs after resuming at step {kill_at}"
    assert logged(tmp_path / "killed" / "aim") == logged(reference / "aim")  # no step lost or doubled
    (run,) = find_runs(str(tmp_path / "killed" / "aim"), experiment="resume")
    assert run["params"]["status"] == "finished" and run["params"]["resumed"] == 1
    steps = [r["step"] for r in read_records(tmp_path / "killed" / "out" / "resume" / "job" / "rl")]
    assert steps == sorted(steps) and set(steps) == set(range(1, 9)) and len(steps) == 8 * 16
    ckpts = sorted(p.name for p in (tmp_path / "killed" / "out" / "resume" / "job" / "rl" / "checkpoints").iterdir())
    assert ckpts == ["step_00000007", "step_00000008"]  # keep-last-2, no temporary folders left


@pytest.mark.slow
def test_a_streamed_dataset_resumes_bit_identically(tmp_path):
    """Prompts streamed from a file (StreamingPromptDataset): the resumed run reads on from the stream position
    saved in the checkpoint, and ends as the uninterrupted run does (the kill step may cross the epoch boundary)."""
    finish(job(tmp_path / "ref" / "out", tmp_path / "ref" / "aim", "stream"))
    kill_at = random.Random().randint(1, 7)
    run_killed_then_resumed(tmp_path / "killed", kill_at, "mid_step", "stream")
    expected, resumed = weights(tmp_path / "ref" / "out"), weights(tmp_path / "killed" / "out")
    for k in expected:
        assert torch.equal(expected[k], resumed[k]), f"{k} differs after resuming at step {kill_at}"
    assert logged(tmp_path / "killed" / "aim") == logged(tmp_path / "ref" / "aim")
    state = json.loads((tmp_path / "killed" / "out" / "resume" / "job" / "rl" / "checkpoints" / "step_00000008"
                        / "trainer_state.json").read_text())
    assert state["data_position"] == {"epoch": 1, "consumed": 8}  # 6 batches of 4 per epoch, then 2 more
