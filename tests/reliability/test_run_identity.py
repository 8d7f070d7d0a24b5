"""A named run remembers what it was started with: a rerun with another graph stops before any
work and says what changed and how to go on; `allow_changes` continues it, recorded."""

import json

import fiddle as fdl
import pytest

from rlhf.runtime.preflight import PreflightError
from rlhf.runtime.experiment import Experiment, run_experiment
from rlhf.runtime.remote import StageOutput
from identity_toys import CountStage, OtherCountStage, ReadStage


def experiment(tmp_path, steps=2, kind=CountStage, label="a", reader=True):
    stages = {"count": fdl.Config(kind, steps=steps, label=label)}
    if reader:
        stages["read"] = fdl.Config(ReadStage, checkpoint=fdl.Config(StageOutput, stage="count"))
    return fdl.Config(
        Experiment, name="toy", output_dir=str(tmp_path / "out"), run_name="job", progress=False, stages=stages
    )


def folder(tmp_path):
    return tmp_path / "out" / "toy" / "job"


def lines(tmp_path):
    return (folder(tmp_path) / "count" / "steps.txt").read_text().split()


def test_the_run_folder_records_graph_hashes_and_every_invocation(tmp_path):
    run_experiment(experiment(tmp_path), overrides=["set:stages.count.steps=2"])
    run_experiment(experiment(tmp_path), overrides=["set:stages.count.steps=2"])  # the same: resumes, nothing to do
    record = json.loads((folder(tmp_path) / "experiment.json").read_text())
    assert [i["overrides"] for i in record["invocations"]] == [["set:stages.count.steps=2"]] * 2
    assert record["stages"]["count"]["graph"]["steps"] == 2 and len(record["stages"]["count"]["graph_hash"]) == 64
    assert lines(tmp_path) == ["a1", "a2"]


def test_a_changed_value_stops_before_any_work_and_says_how_to_go_on(tmp_path):
    run_experiment(experiment(tmp_path))
    with pytest.raises(PreflightError) as err:
        run_experiment(experiment(tmp_path, steps=4, label="b"))
    message = str(err.value)
    assert "stage 'count' of the run in" in message and "was started with a different configuration" in message
    assert "label: 'a' -> 'b'" in message and "steps: 2 -> 4" in message
    assert "--allow_changes" in message and "set:run_name='job-2'" in message
    assert lines(tmp_path) == ["a1", "a2"]
    assert len(json.loads((folder(tmp_path) / "experiment.json").read_text())["invocations"]) == 1  # refused: not one


def test_allowed_changes_run_and_are_recorded(tmp_path):
    run_experiment(experiment(tmp_path, reader=False))
    results = run_experiment(experiment(tmp_path, steps=4, reader=False), allow_changes=True)
    assert lines(tmp_path) == ["a1", "a2", "a3", "a4"]  # the finished stage ran again: 2 more steps
    assert results["count"]["metrics"]["steps"] == 4.0
    record = json.loads((folder(tmp_path) / "experiment.json").read_text())
    assert record["invocations"][-1]["changes"] == {"count": ["steps: 2 -> 4"]}
    assert record["invocations"][-1]["allow_changes"] is True
    assert record["stages"]["count"]["graph"]["steps"] == 4  # the graph it runs with now


def test_another_algorithm_is_refused_even_with_allow_changes(tmp_path):
    run_experiment(experiment(tmp_path))
    with pytest.raises(PreflightError) as err:
        run_experiment(experiment(tmp_path, kind=OtherCountStage), allow_changes=True)
    assert "different model or algorithm" in str(err.value)
    assert "__fn__: 'identity_toys.CountStage' -> 'identity_toys.OtherCountStage'" in str(err.value)


def test_a_stage_downstream_of_a_continued_one_cannot_continue(tmp_path):
    run_experiment(experiment(tmp_path))
    for stages in (None, ["count"]):  # also when only 'count' runs: 'read' would keep a result of the old one
        with pytest.raises(PreflightError, match="stage 'read' .* started from the output of stage 'count'"):
            run_experiment(experiment(tmp_path, steps=4), stages=stages, allow_changes=True)
    assert lines(tmp_path) == ["a1", "a2"]
