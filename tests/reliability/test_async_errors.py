"""Asynchronous rollout ends as synchronous rollout does: an explained error raised in the rollout
producer (a strict scorer's failure) is one line, not a traceback of the producer thread."""

import fiddle as fdl
import pytest

from rlhf.cli.errors import one_line_errors
from rlhf.cli.experiment import build_graph
from rlhf.runtime.experiment import run_experiment
from identity_toys import broken_scorer
from helpers import load_file


@pytest.fixture(scope="module")
def tiny():
    return load_file("experiments/arithmetic_tiny.py")


@pytest.mark.parametrize("mode", ["sync", "one_step_off"])
def test_a_strict_scorer_failure_is_one_line_in_sync_and_async_rollout(tiny, tmp_path, mode, capsys):
    commands = ["fiddler:local", "fiddler:smoke", "fiddler:no_tracking", "set:stages.sft.total_steps=2",
                f"set:output_dir={str(tmp_path)!r}", *(["fiddler:one_step_off"] if mode != "sync" else [])]
    graph, _ = build_graph(tiny, commands)
    graph.stages["grpo"].reward = fdl.Config(fdl.get_callable(graph.stages["grpo"].reward),
                                             scorers={"arithmetic": broken_scorer}, strict=True)
    capsys.readouterr()
    with pytest.raises(SystemExit) as err, one_line_errors():
        run_experiment(graph)
    message = str(err.value.code)
    assert message.startswith("error: ") and "\n" not in message.strip(), message
    assert "data_source 'arithmetic' failed on row" in message and "RuntimeError: scorer exploded" in message
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.timeout(180, method="thread")
@pytest.mark.usefixtures("ray_cluster")
def test_a_dead_ray_worker_is_named_with_where_to_look():
    """A worker process that died (here: SIGKILL, as the OOM killer does) ends the next call with an error
    naming the group, the rank, the method and where its log is; it was a bare `ActorDiedError()`."""
    import os
    import signal

    from rlhf.cli.errors import explained_errors
    from rlhf.runtime.plan import compile_graph
    from rlhf.runtime.ray_runtime import RayRuntime, WorkerDiedError
    from rlhf.runtime.remote import Remote
    from ray_toys import PidWorker

    runtime = RayRuntime(num_cpus=2)
    try:
        group = runtime.start_groups(compile_graph(fdl.Config(Remote, worker=fdl.Config(PidWorker), name="rollout",
                                                              num_workers=2)))["rollout"]
        pids = group.pid()
        os.kill(pids[1], signal.SIGKILL)
        with pytest.raises(WorkerDiedError) as err:
            group.pid()
        message = str(err.value)
        assert "worker group 'rollout'" in message and "rank 1 of 2" in message and "pid()" in message
        assert f"pid {pids[1]}" in message and "logs" in message and "out of memory" in message
        assert "\n" not in message and isinstance(err.value, explained_errors())  # the CLI prints it in one line
    finally:
        runtime.shutdown()
