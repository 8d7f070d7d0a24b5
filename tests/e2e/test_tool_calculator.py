"""End to end: the tool-calculator recipe in smoke form (SFT on tool demonstrations -> multi-turn GRPO
with a calculator -> evaluation with the tool; the no-tool SFT baseline), through the real runtime and Aim."""

from pathlib import Path

import pytest

import rlhf_configs.common as common
from rlhf.cli.rollouts_view import UNTRAINED_STYLE, render_response
from rlhf.runtime.experiment import run_experiment
from rlhf.trainers.records import format_records, read_records
from rlhf.tracking.query import metric_values
from helpers import load_file


def load_recipe():
    return load_file("experiments/tool_calculator.py")


def smoke_graph(tmp_path, *fiddlers):
    """The recipe in smoke form with `fiddlers` applied, quiet, writing under `tmp_path`."""
    recipe = load_recipe()
    graph = recipe.base()
    recipe.smoke(graph)
    for fiddler in (*fiddlers, common.quiet):
        fiddler(graph)
    graph.output_dir = str(tmp_path / "out")
    graph.tracker.repo = str(tmp_path / "aim")
    return graph


@pytest.mark.slow
def test_tool_calculator_smoke(tmp_path):
    results = run_experiment(smoke_graph(tmp_path, common.local))
    assert set(results) == {"sft", "grpo", "eval", "no_tool_sft"}
    grpo = results["grpo"]["metrics"]
    for name in ("num_turns/mean", "num_turns/max", "tool_calls/mean", "tool_errors/total", "tool_errors/rate",
                 "response_length/turn_1/mean", "agent/finish/done", "timing_s/env", "critic/score/mean",
                 "actor/pg_loss"):
        assert name in grpo, name
        assert [s for s, _ in metric_values(str(tmp_path / "aim"), results["grpo"]["run_hash"], name)] == [1, 2], name
    assert "val-aux/num_turns/mean" in results["eval"]["metrics"]  # evaluated with the tool, multi-turn
    assert "val-aux/num_turns/mean" not in results["no_tool_sft"]["metrics"]  # the baseline: single-turn
    stage = Path(results["grpo"]["checkpoint"]).parent
    rows = read_records(stage)
    assert any("segments" in r for r in rows)  # conversations with tool turns were recorded span by span
    shown = format_records(rows)
    assert "trained | " in shown and "context | '\\n<|im_start|>tool\\n" in shown
    row = next(r for r in rows if "segments" in r)
    rendered = render_response(row)  # `rlhf rollouts view`: the untrained spans dimmed
    assert rendered.plain == "".join(s["text"] for s in row["segments"])
    assert {span.style for span in rendered.spans} == {UNTRAINED_STYLE}


@pytest.mark.slow
@pytest.mark.usefixtures("ray_cluster")
def test_tool_calculator_one_step_off_through_ray(tmp_path):
    """The multi-turn recipe with asynchronous rollout (`fiddler:one_step_off`) through Ray: the rollout group
    runs the agent loop, every turn of batch k with the weights of version max(0, k-2). Only the stages GRPO
    needs, and no held-out score of the SFT stage: the smoke test above checks those, and the evaluation and
    the no-tool baseline."""
    graph = smoke_graph(tmp_path, common.one_step_off)
    graph.stages["sft"].evaluator = None
    results = run_experiment(graph, stages=["sft", "grpo"])
    grpo = results["grpo"]
    for name in ("async/staleness/mean", "num_turns/mean", "tool_calls/mean"):
        assert name in grpo["metrics"], name
    staleness = metric_values(str(tmp_path / "aim"), grpo["run_hash"], "async/staleness/mean")
    assert [(s, v) for s, v in staleness] == [(1, 0.0), (2, 1.0)]
    rows = read_records(Path(grpo["checkpoint"]).parent)
    assert {(r["step"], r["policy_version"]) for r in rows} == {(1, 0), (2, 0)}
