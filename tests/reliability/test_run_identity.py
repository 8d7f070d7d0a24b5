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


# --------------------------------------------------------------------------- a result belongs to its graph
def test_an_interrupted_continuation_runs_again_instead_of_reporting_the_old_result(tmp_path, monkeypatch):
    """2 steps finished; continued to 4 with allow_changes and killed at step 4 (after the new graph was
    recorded, before a new result): the same command again must run step 4, not print the 2-step result."""
    run_experiment(experiment(tmp_path, reader=False))
    monkeypatch.setenv("COUNT_FAIL_AT", "4")
    with pytest.raises(RuntimeError, match="injected failure at step 4"):
        run_experiment(experiment(tmp_path, steps=4, reader=False), allow_changes=True)
    monkeypatch.delenv("COUNT_FAIL_AT")
    results = run_experiment(experiment(tmp_path, steps=4, reader=False), allow_changes=True)
    assert lines(tmp_path) == ["a1", "a2", "a3", "a4"]
    assert results["count"]["metrics"]["steps"] == 4.0
    again = run_experiment(experiment(tmp_path, steps=4, reader=False))  # now finished: read back, nothing runs
    assert again["count"]["metrics"]["steps"] == 4.0 and lines(tmp_path) == ["a1", "a2", "a3", "a4"]


def test_a_failed_attempt_with_changes_leaves_the_stage_unfinished_for_a_plain_rerun(tmp_path, monkeypatch):
    """The attempt records its graph before failing; rerunning that same command (no flag needed now: the
    record already holds it) must run the stage rather than reuse the result of the graph before."""
    run_experiment(experiment(tmp_path, reader=False))
    monkeypatch.setenv("COUNT_FAIL_AT", "3")
    with pytest.raises(RuntimeError):
        run_experiment(experiment(tmp_path, steps=3, label="b", reader=False), allow_changes=True)
    monkeypatch.delenv("COUNT_FAIL_AT")
    results = run_experiment(experiment(tmp_path, steps=3, label="b", reader=False))
    assert results["count"]["metrics"]["steps"] == 3.0 and lines(tmp_path) == ["a1", "a2", "b3"]


def test_a_moved_run_folder_reports_its_own_files(tmp_path):
    run_experiment(experiment(tmp_path))
    (tmp_path / "out").rename(tmp_path / "moved")
    graph = experiment(tmp_path)
    graph.output_dir = str(tmp_path / "moved")
    results = run_experiment(graph)
    assert results["count"]["checkpoint"] == str(tmp_path / "moved" / "toy" / "job" / "count" / "steps.txt")
    stored = json.loads((tmp_path / "moved" / "toy" / "job" / "count" / "result.json").read_text())
    assert stored["result"]["checkpoint"] == "steps.txt"  # relative to the stage folder


# --------------------------------------------------------------------------- data are part of the identity
def rows_experiment(tmp_path, data):
    from rlhf.data.sources import load_rows
    from identity_toys import RowsStage

    stage = fdl.Config(RowsStage, rows=fdl.Config(load_rows, path=str(data)))
    return fdl.Config(Experiment, name="toy", output_dir=str(tmp_path / "out"), run_name="job", progress=False,
                      stages={"train": stage})


def test_data_rewritten_under_the_same_name_is_a_change(tmp_path):
    from rlhf.data.files import write_rows
    from rlhf.data.generators import arithmetic_rows

    data = write_rows(arithmetic_rows(6), tmp_path / "train.jsonl")
    assert run_experiment(rows_experiment(tmp_path, data))["train"]["metrics"]["rows"] == 6.0
    assert run_experiment(rows_experiment(tmp_path, data))["train"]["metrics"]["rows"] == 6.0  # unchanged: resumes
    write_rows(arithmetic_rows(9), data)
    with pytest.raises(PreflightError) as err:
        run_experiment(rows_experiment(tmp_path, data))
    message = str(err.value)
    assert f"contents of {data}: '" in message and "was started with a different configuration" in message
    assert "--allow_changes" in message
    results = run_experiment(rows_experiment(tmp_path, data), allow_changes=True)
    assert results["train"]["metrics"]["rows"] == 9.0  # ran again on the new rows, not the old result
    record = json.loads((folder(tmp_path) / "experiment.json").read_text())
    (change,) = record["invocations"][-1]["changes"]["train"]
    assert change.startswith(f"contents of {data}: ")


# --------------------------------------------------------------------------- a model shared with the tokenizer
def test_a_model_change_under_a_shared_node_is_a_model_change(tmp_path):
    """The model node is also the tokenizer's argument: `flatten` lists it under the tokenizer's path,
    and its change must still count as a model change."""
    from rlhf.models.loading import load_tokenizer
    from rlhf.models.tiny import tiny_qwen2

    def graph(hidden):
        model = fdl.Config(tiny_qwen2, path=str(tmp_path / "model"), hidden_size=hidden)
        worker = fdl.Config(ModelWorker, model_path=model)  # `worker.model_path` sorts after `tokenizer...`
        stage = fdl.Config(ModelStage, tokenizer=fdl.Config(load_tokenizer, model), worker=worker)
        return fdl.Config(Experiment, name="toy", output_dir=str(tmp_path / "out"), run_name="job",
                          progress=False, stages={"train": stage})

    run_experiment(graph(32))
    with pytest.raises(PreflightError) as err:
        run_experiment(graph(64), allow_changes=True)
    assert "different model or algorithm" in str(err.value)
    assert "tokenizer.name_or_path.hidden_size: 32 -> 64" in str(err.value)


class ModelWorker:
    def __init__(self, model_path: str):
        self.model_path = model_path


class ModelStage:
    def __init__(self, tokenizer, worker):
        self.worker = worker

    def run(self, ctx):
        return {"metrics": {}}
