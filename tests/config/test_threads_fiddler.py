"""fiddler:threads: every worker group's CPUs, which are its torch threads, on the plan and in the worker."""

import pytest
import torch

from rlhf.cli import main
from rlhf.config.overrides import OverrideError
from rlhf.runtime.local import LocalWorkerGroup
from rlhf.runtime.plan import compile_graph
from rlhf.cli.experiment import build_graph, load_experiment


def test_threads_sets_every_group_and_the_plan_shows_it(capsys):
    recipe = load_experiment("experiments/smollm2_rlhf.py")
    graph, _ = build_graph(recipe, ["fiddler:threads(n=2)"])
    for name, stage in graph.stages.items():
        groups = compile_graph(stage).groups.values()  # the plan's groups, as the runtime will start them
        assert groups and all(g.cpus_per_worker == 2 for g in groups), name
    # more than this machine's CPUs would be refused on Ray; in-process it is the thread count
    assert main(["plan", "experiments/arithmetic_tiny.py", "--config", "fiddler:threads(n=3)",
                 "--config", "fiddler:local"]) == 0
    assert "group policy: 1 x PolicyWorker (cpus 3.0, gpus 0.0 per worker)" in capsys.readouterr().out


def test_a_local_worker_runs_that_many_torch_threads():
    graph, _ = build_graph(load_experiment("experiments/arithmetic_tiny.py"), ["fiddler:threads(n=2)", "fiddler:local"])
    spec = compile_graph(graph.stages["sft"]).groups["policy"]
    before = torch.get_num_threads()
    try:
        LocalWorkerGroup(spec).shutdown()
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_threads_must_be_positive():
    with pytest.raises(OverrideError, match="fiddler:threads needs n >= 1"):
        build_graph(load_experiment("experiments/arithmetic_tiny.py"), ["fiddler:threads(n=0)"])
