"""End to end on the tiny model: SFT -> GRPO -> eval through the real runtimes and Aim."""

import pytest

import rlhf_configs.common as common
from rlhf.runtime.experiment import run_experiment
from rlhf.tracking.query import find_runs, metric_values
from helpers import load_file


def load_experiment():
    return load_file("experiments/arithmetic_tiny.py")


def smoke_graph(tmp_path, *fiddlers):
    module = load_experiment()
    graph = module.base()
    module.smoke(graph)
    common.quiet(graph)
    for f in fiddlers:
        f(graph)
    graph.output_dir = str(tmp_path / "out")
    if graph.tracker is not None:
        graph.tracker.repo = str(tmp_path / "aim")
    return graph


@pytest.mark.slow
@pytest.mark.usefixtures("ray_cluster")
def test_grpo_through_ray_with_two_workers_and_aim_lineage(tmp_path):
    graph = smoke_graph(tmp_path, lambda g: common.workers(g, n=2))
    results = run_experiment(graph)
    assert set(results) == {"sft", "grpo", "eval"}
    assert results["grpo"]["parent_run"] == results["sft"]["run_hash"]
    assert results["eval"]["parent_run"] == results["grpo"]["run_hash"]
    runs = {r["hash"]: r for r in find_runs(str(tmp_path / "aim"), experiment="arithmetic_tiny")}
    grpo = runs[results["grpo"]["run_hash"]]["params"]
    assert grpo["status"] == "finished" and grpo["parent_run"] == results["sft"]["run_hash"]
    assert grpo["data"]["train"] and grpo["git"].keys() == {"commit", "dirty"}
    assert "group policy: 2 x PolicyWorker" in grpo["plan"]
    steps = metric_values(str(tmp_path / "aim"), results["grpo"]["run_hash"], "actor/pg_loss")
    assert [s for s, _ in steps] == [1, 2]
    for name in ["critic/score/mean", "actor/kl_loss", "actor/entropy", "actor/grad_norm", "response_length/mean",
                 "timing_s/gen", "timing_s/update_actor", "timing_s/step", "perf/throughput"]:
        assert metric_values(str(tmp_path / "aim"), results["grpo"]["run_hash"], name), name


@pytest.mark.slow
@pytest.mark.usefixtures("ray_cluster")
def test_local_and_ray_give_the_same_losses(tmp_path):
    local = run_experiment(smoke_graph(tmp_path / "local", common.local, common.no_tracking), stages=["sft", "grpo"])
    ray = run_experiment(smoke_graph(tmp_path / "ray", common.no_tracking), stages=["sft", "grpo"])
    for stage in ("sft", "grpo"):
        a, b = local[stage]["metrics"], ray[stage]["metrics"]
        for key in a:
            if key.startswith(("sft/", "actor/", "critic/", "val-core/")):
                assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-6), f"{stage} {key}"
