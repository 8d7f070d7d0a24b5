"""An agent-program run survives SIGKILL: killed right after a checkpoint (streaming asynchronous rollout, so the
checkpoint holds batches of agent attempts generated ahead), the resumed run trains first on exactly those batches,
with their versions, and then on new ones, none lost or doubled; killed mid-step synchronously, it resumes from
its checkpoint and ends with every step recorded once. (Not bit-identical: which requests share a generate call
depends on when the agents send them, docs/async.md.)"""

import json

import pytest

from rlhf.trainers.async_rollout import QUEUE_FOLDER, read_rollouts
from rlhf.trainers.records import read_records
from test_kill_and_resume import STAGE, finish, job, killed_at, start_killed

KILLS = {"streaming": (4, "after_checkpoint", "async=streaming", "agent"), "sync": (3, "mid_step", "agent")}


@pytest.fixture(scope="module")
def killed(tmp_path_factory):
    """Both tests' jobs to kill, started together (one thread each): {name: (process, folder, kill step)}."""
    jobs = {}
    for name, (kill_at, *how) in KILLS.items():
        tmp = tmp_path_factory.mktemp(name)
        jobs[name] = (start_killed(tmp, kill_at, *how), tmp, kill_at)
    yield jobs
    for proc, *_ in jobs.values():
        if proc.poll() is None:  # its test did not run
            proc.kill()
            proc.communicate()


@pytest.mark.slow
def test_a_killed_streaming_agent_program_run_trains_first_on_the_queued_attempts(killed):
    out, aim = killed_at(*killed["streaming"])
    checkpoint = out / STAGE / "checkpoints" / "step_00000004"
    state = json.loads((checkpoint / "trainer_state.json").read_text())["async_rollout"]
    queued = read_rollouts(checkpoint / QUEUE_FOLDER)
    assert queued and state["next_index"] == 5 + len(queued)
    for q in queued:  # attempts of the agent program, each trajectory within the bound of its step
        assert q.batch["extra_info"][0]["agent"]["finish_reason"] in ("done", "length")
        assert (q.batch["policy_version"] >= q.index - 3).all() and (q.batch["policy_version_last"] <= 4).all()

    finish(job(out, aim, "async=streaming", "agent"))
    rows = read_records(out / STAGE)
    assert sorted({r["step"] for r in rows}) == list(range(1, 9)) and len(rows) == 8 * 16
    for q in queued:
        trained = sorted((r["uid"], r["response"], r["policy_version"]) for r in rows if r["step"] == q.index)
        saved = sorted(zip(q.batch["uid"], q.batch["response_text"], q.batch["policy_version"].tolist()))
        assert trained == saved


@pytest.mark.slow
def test_a_synchronous_agent_program_run_killed_mid_step_resumes(killed):
    out, aim = killed_at(*killed["sync"])
    finish(job(out, aim, "agent"))
    rows = read_records(out / STAGE)
    assert sorted({r["step"] for r in rows}) == list(range(1, 9)) and len(rows) == 8 * 16
    assert all("agent" in r for r in rows)
