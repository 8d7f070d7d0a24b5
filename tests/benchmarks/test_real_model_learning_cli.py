"""benchmarks/real_model_learning.py without a real model: --recipe, metric names read from the graph, and
results written outside the repository unless --out says where."""

import json
import tempfile
from pathlib import Path

import fiddle as fdl
import pytest

from rlhf.data import arithmetic_rows, write_rows
from rlhf.data.sources import load_rows
from rlhf.rewards import RewardManager, exact_match_score
from helpers import load_file

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    return load_file("benchmarks/real_model_learning.py")


def test_defaults_measure_the_arithmetic_recipe_and_write_outside_the_repository(bench):
    args = bench.parse_args([])
    assert Path(args.recipe) == ROOT / "experiments" / "smollm2_arithmetic.py" and args.out is None
    assert bench.DEFAULT_OUT == Path(tempfile.gettempdir()) / "rlhf-benchmarks"
    assert ROOT not in bench.DEFAULT_OUT.resolve().parents
    args = bench.parse_args(["--recipe", "experiments/arithmetic_tiny.py", "--out", "somewhere", "--test-freq", "4"])
    assert (args.recipe, args.out, args.test_freq) == ("experiments/arithmetic_tiny.py", "somewhere", 4)


def test_metric_names_come_from_the_recipes_graph(bench):
    graph, name, names = bench.prepare(bench.parse_args(["--test-freq", "8"]))
    assert name == "grpo" and graph.stages["grpo"].test_freq == 8 and graph.stages["grpo"].val_before_train
    assert names["accuracy"] == ["val-core/arithmetic/reward/mean@1"]  # what was hard-coded before
    assert names["aux"] == {"last_number": ["val-aux/arithmetic/last_number/mean@1"]}
    assert names["heldout_rows"] == 200
    assert fdl.get_callable(graph.tracker) is bench.CurveTracker


def test_metric_names_follow_the_users_data_and_sampling(bench, tmp_path):
    # a recipe whose held-out rows are the user's file (two data sources), sampled 4 times, with no aux reward
    rows = arithmetic_rows(3, split="test") + [{**r, "data_source": "mine"} for r in arithmetic_rows(2, split="test")]
    path = write_rows(rows, tmp_path / "heldout.parquet")
    graph, name, _ = bench.prepare(bench.parse_args(["--recipe", str(ROOT / "experiments" / "arithmetic_tiny.py")]))
    evaluator = graph.stages[name].evaluator
    evaluator.dataset.rows = fdl.Config(load_rows, path=str(path), cache_dir=str(tmp_path / "cache"))
    evaluator.sampling.n = 4
    evaluator.aux_rewards = None
    evaluator.reward = fdl.Config(RewardManager, scorers={"arithmetic": exact_match_score, "mine": exact_match_score})
    names = bench.heldout_metrics(graph.stages[name])
    assert names == {"accuracy": ["val-core/arithmetic/reward/mean@4", "val-core/mine/reward/mean@4"], "aux": {},
                     "heldout_rows": 5}
    base = {"val-core/arithmetic/reward/mean@4": 0.25, "val-core/mine/reward/mean@4": 0.75}
    out = bench.summary(names, base, {k: v + 0.25 for k, v in base.items()})
    assert (out["base_accuracy"], out["trained_accuracy"], out["base_lenient"]) == (0.5, 0.75, None)


def test_a_recipe_without_one_rl_stage_says_so(bench):
    with pytest.raises(ValueError, match=r"has 0 RL stages \(none\).*--recipe"):
        bench.prepare(bench.parse_args(["--recipe", str(ROOT / "experiments" / "generate_and_eval.py")]))


def test_results_go_to_out_or_outside_the_repository(bench, tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "DEFAULT_OUT", tmp_path / "default")
    path = bench.write_result({"base_accuracy": 0.1}, bench.parse_args([]))
    assert path.parent == tmp_path / "default" and path.name.startswith("real_model_learning-smollm2_arithmetic-")
    path = bench.write_result({"base_accuracy": 0.1}, bench.parse_args(["--out", str(tmp_path / "mine")]))
    assert path.parent == tmp_path / "mine" and json.loads(path.read_text()) == {"base_accuracy": 0.1}
