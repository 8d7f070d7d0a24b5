"""Asynchronous rollout survives SIGKILL: with a fixed lag (one step off; two steps off) a killed and resumed
run ends bit-identical to an uninterrupted run of the same mode, since the batches generated ahead are
checkpointed with their versions and the rest are regenerated from (seed, index) with the scheduled weights.
With the newest weights (streaming) runs depend on timing, so the resumed run is checked against its own
checkpoint: it trains first on exactly the batches that were queued, with their versions."""

import json
import random

import pytest
import torch

from rlhf.trainers.async_rollout import QUEUE_FOLDER, read_rollouts
from rlhf.trainers.records import read_records
from test_kill_and_resume import STAGE, finish, job, kill, logged, weights


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["one_step_off", "fixed_lag_2"])
def test_a_killed_fixed_lag_run_resumes_bit_identically(tmp_path, mode):
    reference = tmp_path / "ref"
    uninterrupted = job(reference / "out", reference / "aim", f"async={mode}")  # beside the job to kill
    kill_at = random.Random().randint(1, 6)
    out, aim = kill(tmp_path / "killed", kill_at, "mid_step", f"async={mode}")
    finish(uninterrupted)
    finish(job(out, aim, f"async={mode}"))

    expected, resumed = weights(reference / "out"), weights(out)
    for k in expected:
        assert torch.equal(expected[k], resumed[k]), f"{k} differs after resuming at step {kill_at} ({mode})"
    assert logged(aim) == logged(reference / "aim")
    versions = lambda folder: sorted((r["step"], r["uid"], r["policy_version"]) for r in read_records(folder / STAGE))  # noqa: E731
    assert versions(out) == versions(reference / "out")
    lag = 1 if mode == "one_step_off" else 2
    assert {(step, v) for step, _, v in versions(out)} == {(s, max(0, s - 1 - lag)) for s in range(1, 9)}


@pytest.mark.slow
def test_a_killed_streaming_run_trains_first_on_the_batches_its_checkpoint_queued(tmp_path):
    out, aim = kill(tmp_path, 4, "after_checkpoint", "async=streaming")
    checkpoint = out / STAGE / "checkpoints" / "step_00000004"
    state = json.loads((checkpoint / "trainer_state.json").read_text())["async_rollout"]
    queued = read_rollouts(checkpoint / QUEUE_FOLDER)
    assert queued, "the producer runs ahead: the checkpoint holds the batches it had made"
    assert state["next_index"] == 5 + len(queued) and [q.index for q in queued] == list(range(5, 5 + len(queued)))
    assert all(2 <= q.version <= 4 and q.version >= q.index - 3 for q in queued)  # within the bound of their step

    finish(job(out, aim, "async=streaming"))
    rows = read_records(out / STAGE)
    assert sorted({r["step"] for r in rows}) == list(range(1, 9)) and len(rows) == 8 * 16  # none lost or doubled
    for q in queued:  # the resumed run trained on exactly what was queued, with its version
        trained = sorted((r["uid"], r["response"], r["policy_version"]) for r in rows if r["step"] == q.index)
        saved = sorted(zip(q.batch["uid"], q.batch["response_text"], q.batch["policy_version"].tolist()))
        assert trained == saved
