"""A run killed with SIGKILL and resumed ends bit-identical to an uninterrupted one, also when the
newest checkpoint is broken; a rerun under the same run name with another graph stops before any
work unless the change is allowed, and then really runs it.

One uninterrupted reference run (module fixture) serves every case: the kill cases compare with
it, the rerun cases continue copies of it. Runs that do not depend on each other (a reference and a
job to kill) run side by side: each job is one thread, the machine has two cores.
"""

import json
import os
import random
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlhf.runtime.preflight import PreflightError
from rlhf.runtime.experiment import run_experiment
from rlhf.tracking.query import find_runs, metric_values
from rlhf.trainers.records import read_records
from helpers import small_disk, tiny_model_path

JOB = Path(__file__).with_name("resume_job.py")
METRICS = ["actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "critic/score/mean", "response_length/mean"]
STAGE = Path("resume") / "job" / "rl"


def job(out: Path, aim: Path, *extra: str, kill: dict[str, str] | None = None,
        model: str | None = None) -> subprocess.Popen:
    paths = [str(Path(__file__).parents[2]), str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}  # the project, and tests/ (helpers)
    env.pop("KILL_AT", None)
    env.update(kill or {})
    return subprocess.Popen(
        [sys.executable, str(JOB), model or tiny_model_path(), str(out), str(aim), *extra],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )


def finish(proc: subprocess.Popen) -> str:
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    return err


def weights(out: Path) -> dict[str, torch.Tensor]:
    return load_file(str(out / STAGE / "final" / "model.safetensors"))


def logged(aim: Path) -> dict[str, list]:
    (run,) = find_runs(str(aim), experiment="resume")
    return {name: metric_values(str(aim), run["hash"], name) for name in METRICS}


def start_killed(tmp: Path, kill_at: int, mode: str, *extra: str, model: str | None = None) -> subprocess.Popen:
    """The job, started to kill itself at `kill_at` (`mode`: see resume_job.py), writing under `tmp`."""
    return job(tmp / "out", tmp / "aim", *extra, kill={"KILL_AT": str(kill_at), "KILL_MODE": mode}, model=model)


def killed_at(proc: subprocess.Popen, tmp: Path, kill_at: int) -> tuple[Path, Path]:
    """Waits for `start_killed`'s job to die; its output folder and Aim repo."""
    proc.communicate(timeout=600)
    assert proc.returncode == -signal.SIGKILL, f"the job was to be killed at step {kill_at}"
    return tmp / "out", tmp / "aim"


def kill(tmp: Path, kill_at: int, mode: str, *extra: str, model: str | None = None) -> tuple[Path, Path]:
    return killed_at(start_killed(tmp, kill_at, mode, *extra, model=model), tmp, kill_at)


def truncate_newest_weights(out: Path) -> Path:
    """What a disk that filled up, or a bad copy, leaves: the newest checkpoint's weights cut short
    (its one shard: the policy runs as 1 DDP rank)."""
    newest = sorted((out / STAGE / "checkpoints").glob("step_*"))[-1]
    (weights_file,) = (newest / "policy" / "dcp").glob("*.distcp")
    weights_file.write_bytes(weights_file.read_bytes()[:1000])
    return newest


class Reference:
    """The folder of an uninterrupted run of the job, started when made and waited for on the first
    `reference / name`: the first test's job to kill runs beside it."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.proc: subprocess.Popen | None = job(folder / "out", folder / "aim")

    def __truediv__(self, name: str) -> Path:
        if self.proc is not None:
            proc, self.proc = self.proc, None
            finish(proc)
        return self.folder / name


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted run of the same job (a `Reference`: still running when the first test starts)."""
    ref = Reference(tmp_path_factory.mktemp("ref"))
    yield ref
    if ref.proc is not None:  # no test read it: do not leave it running
        ref.proc.kill()
        ref.proc.communicate()


# The job has 6 steps per epoch: the second case dies right after the epoch-boundary checkpoint.
# The first also truncates the newest checkpoint before resuming: resume must fall back to the
# one before it (or to the start, when the kill came at step 1) and still end bit-identical.
@pytest.mark.slow
@pytest.mark.parametrize(
    "kill_at, mode, corrupt",
    [(random.Random().randint(1, 5), "mid_step", True), (6, "after_checkpoint", False)],
    ids=["random_step_corrupt_newest_checkpoint", "epoch_boundary"],
)
def test_sigkill_and_resume_is_bit_identical(tmp_path, reference, kill_at, mode, corrupt):
    out, aim = kill(tmp_path / "killed", kill_at, mode)
    broken = truncate_newest_weights(out) if corrupt else None
    err = finish(job(out, aim))

    expected, resumed = weights(reference / "out"), weights(out)
    assert expected.keys() == resumed.keys()
    for k in expected:
        assert torch.equal(expected[k], resumed[k]), f"{k} differs after resuming at step {kill_at}"
    assert logged(aim) == logged(reference / "aim")  # no step lost or doubled
    (run,) = find_runs(str(aim), experiment="resume")
    assert run["params"]["status"] == "finished" and run["params"]["resumed"] == 1
    steps = [r["step"] for r in read_records(out / STAGE)]
    assert steps == sorted(steps) and set(steps) == set(range(1, 9)) and len(steps) == 8 * 16
    ckpts = sorted(p.name for p in (out / STAGE / "checkpoints").iterdir())
    if corrupt:
        assert f"skipped checkpoint {broken} because" in err and "truncated or replaced" in err
        assert run["params"]["resume"]["skipped"][0].startswith(f"skipped checkpoint {broken}")
        (aside,) = [c for c in ckpts if c.startswith(f"{broken.name}.broken-")]  # kept, never deleted
        ckpts.remove(aside)
    assert ckpts == ["step_00000007", "step_00000008"]  # keep-last-2, no temporary folders left


def continued_copy(reference: Reference, tmp: Path) -> tuple[Path, Path]:
    """A copy of the finished reference run to rerun (the reference stays as it is)."""
    shutil.copytree(reference / "out", tmp / "out")
    shutil.copytree(reference / "aim", tmp / "aim")
    return tmp / "out", tmp / "aim"


@pytest.mark.slow
def test_more_steps_need_allow_changes_and_then_really_run(tmp_path, reference):
    import resume_job  # this folder is on sys.path (pytest's rootdir-relative import)

    out, aim = continued_copy(reference, tmp_path)
    with pytest.raises(PreflightError) as err:  # in-process: the preflight refuses before any model loads
        run_experiment(resume_job.graph(tiny_model_path(), str(out), str(aim), steps=10))
    assert "total_steps: 8 -> 10" in str(err.value) and "--allow_changes" in str(err.value)
    assert "set:run_name='job-2'" in str(err.value)
    assert len(read_records(out / STAGE)) == 8 * 16  # nothing ran

    finish(job(out, aim, "steps=10", "allow_changes"))
    steps = sorted({r["step"] for r in read_records(out / STAGE)})
    assert steps == list(range(1, 11))  # steps 9 and 10 ran, continued from checkpoint 8
    (run,) = find_runs(str(aim), experiment="resume")
    assert [s for s, _ in metric_values(str(aim), run["hash"], "actor/pg_loss")] == list(range(1, 11))
    first, second = run["params"]["invocations"]  # the Aim run records each invocation
    assert first["changes"] == {} and second["changes"] == {"rl": ["total_steps: 8 -> 10"]}
    assert second["allow_changes"] is True
    assert run["params"]["graph"]["total_steps"] == 10 and run["params"]["status"] == "finished"


@pytest.mark.slow
def test_a_continuation_killed_midway_finishes_on_the_next_run(tmp_path, reference):
    """8 steps finished; continued to 10 with allow_changes and SIGKILLed after checkpoint 9 (the new graph
    recorded, the 8-step result.json still there): the same command again runs step 10, it does not report
    the 8-step result."""
    out, aim = continued_copy(reference, tmp_path)
    killed = job(out, aim, "steps=10", "allow_changes", kill={"KILL_AT": "9", "KILL_MODE": "after_checkpoint"})
    killed.communicate(timeout=600)
    assert killed.returncode == -signal.SIGKILL
    finish(job(out, aim, "steps=10", "allow_changes"))
    assert sorted({r["step"] for r in read_records(out / STAGE)}) == list(range(1, 11))
    (run,) = find_runs(str(aim), experiment="resume")
    assert [s for s, _ in metric_values(str(aim), run["hash"], "actor/pg_loss")] == list(range(1, 11))
    result = json.loads((out / STAGE / "result.json").read_text())
    assert result["result"]["metrics"]["actor/pg_loss"] == metric_values(str(aim), run["hash"], "actor/pg_loss")[-1][1]
    ten, eight = weights(out), weights(reference / "out")
    assert not all(torch.equal(ten[k], eight[k]) for k in ten)  # final/ holds 10 steps, not the 8-step weights


def test_a_copied_run_and_one_killed_before_its_result_report_their_own_weights_and_metrics(tmp_path, reference):
    """result.json stores paths relative to the stage folder (a copy points at its own final/), and a
    stage killed between writing final/ and result.json reports its last step's metrics from the
    checkpoint (it used to report `metrics: {}`)."""
    import resume_job  # this folder is on sys.path (pytest's rootdir-relative import)

    out, aim = continued_copy(reference, tmp_path)
    stored = json.loads((reference / "out" / STAGE / "result.json").read_text())
    expected = stored.get("result", stored)["metrics"]
    graph = resume_job.graph(tiny_model_path(), str(out), str(aim))
    assert run_experiment(graph)["rl"]["checkpoint"] == str(out / STAGE / "final")  # finished: read back
    (out / STAGE / "result.json").unlink()  # the state a kill right after writing final/ leaves
    rerun = run_experiment(graph)["rl"]  # resumes at checkpoint 8 = the last step: nothing left to run
    assert rerun["checkpoint"] == str(out / STAGE / "final")
    assert {k: rerun["metrics"][k] for k in METRICS} == {k: expected[k] for k in METRICS}
    assert sorted({r["step"] for r in read_records(out / STAGE)}) == list(range(1, 9))


def test_resuming_into_a_run_of_another_model_is_a_preflight_error(tmp_path, reference):
    """In-process: the preflight stops it before any model loads."""
    import resume_job  # this folder is on sys.path (pytest's rootdir-relative import)

    out, aim = continued_copy(reference, tmp_path)
    other = tiny_model_path(seed=1)
    graph = resume_job.graph(other, str(out), str(aim))
    with pytest.raises(PreflightError) as err:
        run_experiment(graph, allow_changes=True)  # not even allowed changes cover another model
    message = str(err.value)
    assert "different model or algorithm" in message
    assert f"policy.worker.model_path: '{tiny_model_path()}' -> '{other}'" in message


@pytest.mark.slow
def test_a_streamed_dataset_resumes_bit_identically(tmp_path):
    """Prompts streamed from a file (StreamingPromptDataset): the resumed run reads on from the stream position
    saved in the checkpoint, and ends as the uninterrupted run does (the kill step may cross the epoch boundary)."""
    ref = job(tmp_path / "ref" / "out", tmp_path / "ref" / "aim", "stream")  # beside the job to kill
    kill_at = random.Random().randint(1, 7)
    out, aim = kill(tmp_path / "killed", kill_at, "mid_step", "stream")
    finish(ref)
    finish(job(out, aim, "stream"))
    expected, resumed = weights(tmp_path / "ref" / "out"), weights(out)
    for k in expected:
        assert torch.equal(expected[k], resumed[k]), f"{k} differs after resuming at step {kill_at}"
    assert logged(aim) == logged(tmp_path / "ref" / "aim")
    state = json.loads((out / STAGE / "checkpoints" / "step_00000008" / "trainer_state.json").read_text())
    assert state["data_position"] == {"epoch": 1, "consumed": 8}  # 6 batches of 4 per epoch, then 2 more


@pytest.mark.slow
def test_a_full_disk_during_a_checkpoint_write_is_one_line_and_the_run_resumes(tmp_path, reference):
    """A real full filesystem (a 20 MB tmpfs, filled after checkpoint 2): the write of checkpoint 3 fails.
    The job ends with the documented one-line CheckpointError (it was a 93-line traceback: torch's
    `CheckpointException` is a BaseException and escaped the handling), no partial folder stays, and
    once space is freed the same command resumes from checkpoint 2 and ends bit-identical. Its Aim run
    then says finished, with the earlier error moved to `earlier_errors`."""
    with small_disk(tmp_path / "disk") as disk:
        out, aim = disk / "out", tmp_path / "aim"
        proc = job(out, aim, kill={"KILL_AT": "2", "KILL_MODE": "fill_disk"})
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 1, err[-3000:]
        assert "Traceback" not in err, err[-3000:]
        last = err.strip().splitlines()[-1]
        checkpoints = out / STAGE / "checkpoints"
        assert last.startswith(f"error: could not write checkpoint {checkpoints / 'step_00000003'} ("), last
        assert "No space left on device" in last and last.endswith("then resume.")
        assert f"the previous checkpoint {checkpoints / 'step_00000002'} is intact" in last
        assert sorted(p.name for p in checkpoints.iterdir()) == ["step_00000001", "step_00000002"]
        (run,) = find_runs(str(aim), experiment="resume")
        assert run["params"]["status"] == "failed" and "CheckpointError" in run["params"]["error"]

        (disk / "out" / "filler").unlink()
        finish(job(out, aim))
        expected, resumed = weights(reference / "out"), weights(out)
        for k in expected:
            assert torch.equal(expected[k], resumed[k]), k
        assert logged(aim) == logged(reference / "aim")
        (run,) = find_runs(str(aim), experiment="resume")
        assert run["params"]["status"] == "finished" and "error" not in run["params"]
        assert "CheckpointError" in run["params"]["earlier_errors"][0]
