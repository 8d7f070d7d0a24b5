"""benchmarks/transfer.py's bookkeeping: task specs, Wilson intervals, the verdict against the issue's targets."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import transfer  # noqa: E402


def test_task_specs_carry_settings_as_json():
    assert transfer.parse_task("arithmetic") == ("arithmetic", {})
    assert transfer.parse_task('reasoning_gym/chain_sum={"max_terms": 2}') == ("reasoning_gym/chain_sum",
                                                                                {"max_terms": 2})
    assert all(transfer.parse_task(spec)[0] for spec in transfer.PANEL)
    assert len(transfer.PANEL) >= 8 and sum(s.startswith("reasoning_gym/") for s in transfer.PANEL) >= 6


def test_task_lists_split_outside_the_settings_braces():
    assert transfer.split_specs('reasoning_gym/letter_counting={"min_words": 3, "max_words": 5},arithmetic') == [
        'reasoning_gym/letter_counting={"min_words": 3, "max_words": 5}', "arithmetic"]
    assert transfer.split_specs("a; b;") == ["a", "b"]
    assert [transfer.parse_task(s) for s in transfer.split_specs(",".join(transfer.PANEL))] == \
        [transfer.parse_task(s) for s in transfer.PANEL]


def test_wilson_interval_hand_computed():
    # p = 0.5, n = 200: centre 0.5, half-width 1.96 * sqrt(0.25/200 + 1.96^2/160000) / (1 + 1.96^2/200)
    #   = 1.96 * 0.035693 / 1.019208 = 0.0686
    assert transfer.wilson(0.5, 200) == pytest.approx([0.4314, 0.5686], abs=1e-4)
    low, high = transfer.wilson(0.0, 200)
    assert low == 0.0 and high == pytest.approx(0.0188, abs=1e-4)  # never a negative or empty interval at 0


def row(base, trained, lenient):
    return {"base_accuracy": base, "trained_accuracy": trained, "base_lenient": lenient, "gain": trained - base}


def test_verdict_checks_each_target_separately():
    good = transfer.verdict([row(0.0, 0.3, 0.2), row(0.1, 0.3, 0.25)])
    assert good["every_task_gains_10_points"] and good["none_below_base_lenient"] and good["mean_gain_15_points"]
    below = transfer.verdict([row(0.0, 0.15, 0.2), row(0.0, 0.4, 0.1)])  # gains 15 and 40, but one below its lenient
    assert below["every_task_gains_10_points"] and not below["none_below_base_lenient"]
    small = transfer.verdict([row(0.0, 0.05, 0.0), row(0.0, 0.5, 0.0)])
    assert not small["every_task_gains_10_points"] and small["mean_gain_15_points"]
    collapsed = transfer.verdict([row(0.0, 0.3, 0.2), {**row(0.5, 0.6, 0.5), "task": "letters", "collapsed": True}])
    assert not collapsed["every_task_gains_10_points"] and collapsed["collapsed_tasks"] == ["letters"]
    assert good["collapsed_tasks"] == []
    failed = transfer.verdict([{"task": "x", "error": ["boom"]}])
    assert failed["tasks_failed"] == 1 and not failed["every_task_gains_10_points"]


def test_the_seed_reaches_the_training_stage_and_leaves_the_rows(tmp_path):
    graphs = [transfer.panel_graph("reasoning_gym/gcd", {"max_value": 20}, 3, tmp_path, seed=seed) for seed in (0, 7)]
    assert [g.stages["grpo"].seed for g in graphs] == [0, 7]
    assert graphs[0].stages["grpo"].total_steps == 3
    for part in ("train_data", "evaluator"):  # the same rows for every seed: the spread is the training's
        assert repr(getattr(graphs[0].stages["grpo"], part)) == repr(getattr(graphs[1].stages["grpo"], part))


def test_set_overrides_reach_the_graph_after_the_seed(tmp_path):
    graph = transfer.panel_graph("reasoning_gym/gcd", {}, 3, tmp_path, seed=1,
                                 overrides=("set:stages.grpo.prompts_per_step=16", "set:stages.grpo.sampling.n=4"))
    assert (graph.stages["grpo"].prompts_per_step, graph.stages["grpo"].sampling.n, graph.stages["grpo"].seed) == (16, 4, 1)
