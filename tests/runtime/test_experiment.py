"""run_experiment: stages in order, StageOutput resolution, lineage, preflight, Ctrl-C."""

import fiddle as fdl
import pytest

from rlhf.runtime.preflight import PreflightError
from rlhf.runtime.experiment import Experiment, run_experiment
from rlhf.runtime.local import LocalRuntime
from rlhf.runtime.remote import Remote, StageOutput
from rlhf.tracking.aim_tracker import AimTracker
from rlhf.tracking.query import find_runs, metric_values
from toy_stages import InterruptStage, ReadStage, WriteStage, checked
from toy_workers import EchoWorker


def experiment(tmp_path, stages, tracker=True):
    return fdl.Config(
        Experiment,
        name="toy",
        stages=stages,
        runtime=fdl.Config(LocalRuntime),
        tracker=fdl.Config(AimTracker, repo=str(tmp_path / "aim"), experiment="toy") if tracker else None,
        output_dir=str(tmp_path / "out"),
        progress=False,
    )


def test_stage_outputs_flow_and_lineage_is_recorded(tmp_path):
    stages = {
        "write": fdl.Config(WriteStage, text="hello", group=fdl.Config(Remote, worker=fdl.Config(EchoWorker), name="g")),
        "read": fdl.Config(ReadStage, checkpoint=fdl.Config(StageOutput, stage="write")),
    }
    results = run_experiment(experiment(tmp_path, stages), overrides=["set:x=1"], fiddlers=["tiny"])
    assert results["read"]["metrics"]["read"] == 5.0
    assert results["read"]["parent_run"] == results["write"]["run_hash"]
    runs = {r["hash"]: r for r in find_runs(str(tmp_path / "aim"), experiment="toy")}
    assert set(runs) == {results["write"]["run_hash"], results["read"]["run_hash"]}
    read_run = runs[results["read"]["run_hash"]]
    assert read_run["params"]["parent_run"] == results["write"]["run_hash"]
    assert read_run["params"]["overrides"] == ["set:x=1"] and read_run["params"]["fiddlers"] == ["tiny"]
    assert read_run["params"]["graph"]["checkpoint"].endswith("ckpt.txt")  # resolved value recorded
    assert metric_values(str(tmp_path / "aim"), results["write"]["run_hash"], "val-core/toy/reward/mean@1") == [(1, 5.0)]


def test_reference_to_a_later_stage_is_an_error(tmp_path):
    stages = {
        "read": fdl.Config(ReadStage, checkpoint=fdl.Config(StageOutput, stage="write")),
        "write": fdl.Config(WriteStage, text="x"),
    }
    with pytest.raises(ValueError, match="has not run before it"):
        run_experiment(experiment(tmp_path, stages, tracker=False))


def test_preflight_stops_before_any_stage(tmp_path):
    stages = {
        "write": fdl.Config(WriteStage, text="x"),
        "read": fdl.Config(ReadStage, checkpoint=fdl.Config(checked, path="/no/such/file")),
    }
    with pytest.raises(PreflightError, match=r"stages\['read'\].checkpoint: no such thing"):
        run_experiment(experiment(tmp_path, stages, tracker=False))
    assert not (tmp_path / "out").exists()  # nothing ran


def test_ctrl_c_closes_the_run_as_interrupted(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        run_experiment(experiment(tmp_path, {"boom": fdl.Config(InterruptStage)}))
    (run,) = find_runs(str(tmp_path / "aim"), experiment="toy")
    assert run["params"]["status"] == "interrupted"
