"""A partial-rollouts run survives SIGKILL: killed right after a checkpoint while conversations were still running
in the pool (3-turn conversations beside 1-turn ones), the checkpoint holds those groups' prompts; the resumed run
restarts them from their prompts (an environment's state cannot be saved) and trains each, and ends with every
step recorded once, none lost or doubled. (Not bit-identical: which turns share a generate call depends on when
the weights arrive, docs/async.md.)"""

import json
from collections import Counter

import pytest

from rlhf.trainers.async_rollout import POOL_FILE, QUEUE_FOLDER, read_rollouts
from rlhf.trainers.records import read_records
from helpers import short_answer_model
from test_kill_and_resume import STAGE, finish, job, kill

KILL_AT = 4


@pytest.mark.slow
def test_a_killed_partial_rollouts_run_restarts_the_running_conversations(tmp_path):
    model = short_answer_model()  # its turns end on EOS, so a conversation can go on to a next turn
    out, aim = kill(tmp_path, KILL_AT, "after_checkpoint", "async=partial", "partial", model=model)
    checkpoint = out / STAGE / "checkpoints" / f"step_{KILL_AT:08d}"
    pool = json.loads((checkpoint / POOL_FILE).read_text())
    assert pool, "the checkpoint was to hold conversations still running"
    running = [g["record"]["uid"] for g in pool]  # uid: the row's (the same row drawn in the next epoch shares it)
    queued = Counter(uid for q in read_rollouts(checkpoint / QUEUE_FOLDER) for uid in q.batch["uid"])
    before = read_records(out / STAGE)
    assert sorted({r["step"] for r in before}) == list(range(1, KILL_AT + 1))

    finish(job(out, aim, "async=partial", "partial", model=model))
    rows = read_records(out / STAGE)
    steps = Counter(r["step"] for r in rows)
    assert sorted(steps) == list(range(1, 9)) and set(steps.values()) == {16}, steps  # 4 prompts x 4, once each
    assert [r for r in rows if r["step"] <= KILL_AT] == before  # the steps before the kill kept as they were
    after = Counter(r["uid"] for r in rows if r["step"] > KILL_AT)
    for uid in running:  # restarted and trained after the resume with all its samples, beside any queued draw of it
        assert after[uid] >= queued[uid] + 4, (uid, after, queued)
    assert all(r["agent"]["num_turns"] in (1, 2, 3) for r in rows)
