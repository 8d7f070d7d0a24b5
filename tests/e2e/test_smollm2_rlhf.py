"""The preference pipeline recipe end to end on SmolLM2: the smoke fiddler's tiny samples -> reward model -> GRPO and
samples -> DPO, in process; the reward model's folder loads whole for RL, and GRPO logs the gold rule beside the reward model's score."""

from pathlib import Path

import pytest

import rlhf_configs.common as common
from rlhf.cli.experiment import build_graph
from rlhf.runtime.experiment import run_experiment
from rlhf.trainers.records import read_records
from rlhf.workers.reward_model import RewardModelWorker
from helpers import load_file

GOLD = "val-core/direct_answer/reward/mean@1"


@pytest.mark.real_model
@pytest.mark.slow
def test_smoke_runs_the_whole_pipeline(smollm2_path, tmp_path):
    recipe = load_file("experiments/smollm2_rlhf.py")
    graph, _ = build_graph(recipe, [f'config:base(model="{smollm2_path}")', "fiddler:smoke", "fiddler:local"])
    for fiddler in (common.quiet, common.no_tracking):
        fiddler(graph)
    graph.output_dir = str(tmp_path)
    results = run_experiment(graph)
    assert Path(results["samples"]["generations"]).is_file()
    folder = results["rm"]["checkpoint"]
    RewardModelWorker(folder, max_length=64)  # every weight there, the head included
    grpo = results["grpo"]
    assert 0.0 <= grpo["metrics"][GOLD] <= 1.0
    assert {"reward/rule/mean", "reward/model/mean"} <= set(grpo["metrics"])
    records = read_records(Path(grpo["checkpoint"]).parent)
    assert all({"rule/score", "model/score"} <= set(r["reward_extra"]) for r in records)
    assert all(r["score"] == pytest.approx(r["reward_extra"]["model/score"], abs=1e-5) for r in records)  # RM only
    dpo = results["dpo"]["metrics"]
    assert 0.0 <= dpo[GOLD] <= 1.0  # the DPO policy's own answers, scored by the gold rule
    assert {"rewards/margins", "rewards/accuracies"} <= set(dpo)
