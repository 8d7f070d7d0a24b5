"""A partial-rollouts run survives SIGKILL: killed right after a checkpoint while conversations were still running
in the pool (3-turn conversations beside 1-turn ones), the checkpoint holds those groups' prompts; the resumed run
restarts them from their prompts (an environment's state cannot be saved), saying so in one line, and ends with
every step recorded once with whole groups. (Not bit-identical: which turns share a generate call depends on when
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
    assert all(g["prompt_ids"] for g in pool)  # what a restart needs: the prompt, tokenized as it was
    queued = Counter(uid for q in read_rollouts(checkpoint / QUEUE_FOLDER) for uid in q.batch["uid"])
    before = read_records(out / STAGE)
    assert sorted({r["step"] for r in before}) == list(range(1, KILL_AT + 1))

    err = finish(job(out, aim, "async=partial", "partial", model=model))
    assert f"restarting {len(pool)} conversation group(s) that were running at step_{KILL_AT:08d}" in err
    rows = read_records(out / STAGE)
    steps = Counter(r["step"] for r in rows)
    assert sorted(steps) == list(range(1, 9)) and set(steps.values()) == {16}, steps  # 4 prompts x 4, once each
    assert [r for r in rows if r["step"] <= KILL_AT] == before  # the steps before the kill kept as they were
    # a restarted group is trained once it ends (beside any queued draw of the same row); it may also outlive the
    # bound (dropped, counted) or still be running when the last batch is taken: timing decides which
    after = Counter(r["uid"] for r in rows if r["step"] > KILL_AT)
    assert all(after[uid] % 4 == 0 for uid in running) and queued  # whole groups only
    assert all(r["agent"]["num_turns"] in (1, 2, 3) for r in rows)
