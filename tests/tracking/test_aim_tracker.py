"""AimTracker: runs carry their lineage and are queryable the moment they close."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import threading

import fiddle as fdl
import pytest

from rlhf.graph import io as graph_io
from rlhf.tracking import query
from rlhf.tracking.aim_tracker import AimTracker
from rlhf.tracking.lineage import lineage_params


@dataclasses.dataclass
class ToyPolicy:
    hidden: int = 64
    lr: float = 1e-3


def toy_experiment(policy=None, ref=None, steps: int = 10):
    return policy, ref, steps


def toy_graph(hidden: int = 8) -> fdl.Config:
    policy = fdl.Config(ToyPolicy, hidden=hidden)
    return fdl.Config(toy_experiment, policy=policy, ref=policy, steps=3)


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    """One Aim repo for the module: creating one costs ~2 s (its sqlite migrations)."""
    return str(tmp_path_factory.mktemp("aim"))


def tracker(repo, experiment):
    return AimTracker(repo, experiment=experiment)


def test_tracker_creates_the_repo(tmp_path):
    path = tmp_path / "fresh"
    AimTracker(str(path))
    assert (path / ".aim").is_dir()


def test_closed_run_is_queryable_at_once_with_params_metrics_texts_and_graph(repo):
    graph = toy_graph()
    params = lineage_params(
        graph=graph,
        overrides=["set:policy.hidden=8"],
        fiddlers=["tiny"],
        parent_run=None,
        data_fingerprints={"train": "sha256:abc"},
        plan_text="policy: 1 worker",
    )
    with tracker(repo, "full").start_run("sft", params=params, tags=["smoke"]) as run:
        for step in range(3):
            run.track({"actor/pg_loss": 0.5 * step, "val-core/arithmetic/acc/mean@1": 0.25 * step}, step=step)
        run.log_text("samples", "1+1=2", step=0)
        run.log_text("samples", "2+2=4", step=1)
    assert run.closed

    (found,) = query.find_runs(repo, experiment="full")
    assert found["hash"] == run.hash
    assert (found["stage"], found["status"], found["parent_run"], found["tags"]) == ("sft", "finished", None, ["smoke"])
    assert found["graph_hash"] == graph_io.graph_hash(graph)
    stored = found["params"]
    assert stored["graph"] == graph_io.nest(graph_io.flatten(graph))
    assert stored["graph"]["policy"]["hidden"] == 8
    assert (stored["overrides"], stored["fiddlers"], stored["data"], stored["plan"]) == (
        ["set:policy.hidden=8"],
        ["tiny"],
        {"train": "sha256:abc"},
        "policy: 1 worker",
    )
    # Metric names keep their slashes and `@`; values come back per step.
    assert query.metric_values(repo, run.hash, "actor/pg_loss") == [(0, 0.0), (1, 0.5), (2, 1.0)]
    assert query.metric_values(repo, run.hash, "val-core/arithmetic/acc/mean@1") == [(0, 0.0), (1, 0.25), (2, 0.5)]
    assert query.metric_values(repo, run.hash, "never/tracked") == []
    assert query.text_values(repo, run.hash, "samples") == [(0, "1+1=2"), (1, "2+2=4")]
    # The graph is stored with the run twice: as a param and as an artifact file.
    for stored_json in (stored["graph_json"], query.artifact_path(repo, run.hash, "graph.json").read_text()):
        rebuilt = graph_io.from_json(stored_json)
        assert rebuilt == graph
        assert rebuilt.ref is rebuilt.policy


def test_two_runs_in_one_repo_record_their_parent(repo):
    aim_tracker = tracker(repo, "chain")
    with aim_tracker.start_run("sft") as sft:
        sft.track({"loss": 1.0}, step=0)
    with aim_tracker.start_run("rl", parent_run=sft.hash) as rl:
        rl.track({"loss": 2.0}, step=0)

    runs = query.find_runs(repo, experiment="chain")
    assert [(r["hash"], r["stage"], r["parent_run"]) for r in runs] == [
        (sft.hash, "sft", None),
        (rl.hash, "rl", sft.hash),
    ]
    assert query.metric_values(repo, rl.hash, "loss") == [(0, 2.0)]


def test_keyboard_interrupt_leaves_a_closed_indexed_interrupted_run(repo):
    with pytest.raises(KeyboardInterrupt):
        with tracker(repo, "ctrl-c").start_run("rl") as run:
            run.track({"actor/pg_loss": 0.1}, step=0)
            raise KeyboardInterrupt
    (found,) = query.find_runs(repo, experiment="ctrl-c")
    assert (found["hash"], found["status"]) == (run.hash, "interrupted")
    assert found["params"]["error"].startswith("KeyboardInterrupt")
    assert query.metric_values(repo, run.hash, "actor/pg_loss") == [(0, 0.1)]


def test_an_exception_closes_the_run_as_failed_and_propagates(repo):
    with pytest.raises(ValueError, match="diverged"):
        with tracker(repo, "crash").start_run("rl") as run:
            raise ValueError("loss diverged")
    (found,) = query.find_runs(repo, experiment="crash")
    assert (found["hash"], found["status"], found["params"]["error"]) == (
        run.hash,
        "failed",
        "ValueError: loss diverged",
    )


def test_set_params_merges_nested_dicts(repo):
    with tracker(repo, "params").start_run("eval", params={"hparams": {"lr": 0.1, "opt": {"beta": 0.9}}}) as run:
        run.set_params({"hparams": {"opt": {"eps": 1e-8}}, "checkpoint": "/ckpt/step_10"})
        run.set_params({"checkpoint": "/ckpt/step_20"})
    (found,) = query.find_runs(repo, experiment="params")
    assert found["params"]["hparams"] == {"lr": 0.1, "opt": {"beta": 0.9, "eps": 1e-8}}
    assert found["params"]["checkpoint"] == "/ckpt/step_20"


def test_close_is_explicit_idempotent_and_leaves_no_threads(repo):
    before = set(threading.enumerate())
    run = tracker(repo, "explicit").start_run("eval")
    run.track({"score": 3.0}, step=7)
    run.close("interrupted")
    run.close("finished")  # a second close changes nothing
    assert set(threading.enumerate()) <= before
    (found,) = query.find_runs(repo, experiment="explicit")
    assert found["status"] == "interrupted"
    assert query.metric_values(repo, run.hash, "score") == [(7, 3.0)]


def test_save_artifact_takes_text_or_a_file(repo, tmp_path):
    source = tmp_path / "plan.txt"
    source.write_text("policy: 2 workers")
    with tracker(repo, "artifacts").start_run("rl") as run:
        run.save_artifact("notes.md", "# notes")
        run.save_artifact("plan.txt", source)
    assert query.artifact_path(repo, run.hash, "notes.md").read_text() == "# notes"
    assert query.artifact_path(repo, run.hash, "plan.txt").read_text() == "policy: 2 workers"
    assert query.artifact_path(repo, run.hash, "missing") is None


def test_an_open_run_is_listed_without_params_until_it_closes(repo):
    aim_tracker = tracker(repo, "open")
    run = aim_tracker.start_run("rl", params={"k": 1})
    try:
        (listed,) = query.find_runs(repo, experiment="open")
        assert (listed["hash"], listed["status"], listed["params"]) == (run.hash, None, {})
    finally:
        run.close()
    (listed,) = query.find_runs(repo, experiment="open")
    assert (listed["status"], listed["params"]["k"]) == ("finished", 1)


# Holds the repo's index open for writing (as another process closing a run, or `aim up`
# indexing, would) until its stdin closes.
_HOLD_INDEX = (
    "import sys, aim\n"
    "index = aim.Repo.from_path(sys.argv[1])._get_index_tree('meta', 0)\n"
    "print('holding', flush=True)\n"
    "sys.stdin.read()\n"
)


def test_closing_waits_for_an_index_held_by_another_process(repo):
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD_INDEX, repo], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "holding"
        run = tracker(repo, "busy").start_run("rl")
        threading.Timer(0.5, holder.stdin.close).start()
        run.close()  # retries until the holder lets go
    finally:
        holder.wait(timeout=30)
    (found,) = query.find_runs(repo, experiment="busy")
    assert (found["hash"], found["status"]) == (run.hash, "finished")


_FIRST_RUN = (
    "import sys\n"
    "from rlhf.tracking.aim_tracker import AimTracker\n"
    "with AimTracker(sys.argv[1], experiment='race').start_run('rl') as run:\n"
    "    run.track({'x': 1.0}, step=1)\n"
)


@pytest.mark.slow
def test_first_runs_of_several_processes_into_a_new_repo_all_succeed(tmp_path):
    """Four processes open a repository that does not exist yet, at once: without the lock the ones that saw
    the half-made repository failed with `no such table: run` (reproduced in every try of four)."""
    repo = tmp_path / "new"
    procs = [subprocess.Popen([sys.executable, "-c", _FIRST_RUN, str(repo)], stderr=subprocess.PIPE, text=True)
             for _ in range(4)]
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, [e[-800:] for e in errors if "Error" in e]
    assert len(query.find_runs(str(repo), experiment="race")) == 4


def test_a_resumed_run_that_finishes_keeps_no_error(repo):
    """A run that failed and was then resumed to the end said `status=finished` beside the old `error`."""
    aim_tracker = tracker(repo, "resumed")
    with pytest.raises(OSError):
        with aim_tracker.start_run("rl") as run:
            raise OSError(28, "No space left on device")
    with aim_tracker.resume_run(run.hash) as resumed:
        resumed.track({"score": 1.0}, step=2)
    (found,) = query.find_runs(repo, experiment="resumed")
    assert found["status"] == "finished" and "error" not in found["params"]
    assert found["params"]["earlier_errors"] == ["OSError: [Errno 28] No space left on device"]
