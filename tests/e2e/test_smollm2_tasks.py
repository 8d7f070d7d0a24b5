"""The default task recipe end to end on SmolLM2: two tiny GRPO steps of experiments/smollm2_tasks.py on a
reasoning-gym task, with the held-out strict and lenient scores and the reward's partial share in the metrics."""

import pytest

import rlhf_configs.common as common
from rlhf.cli.experiment import build_graph, load_experiment
from rlhf.runtime.experiment import run_experiment

SOURCE = "reasoning_gym/gcd"


@pytest.mark.real_model
def test_smoke_trains_and_validates_a_reasoning_gym_task_on_smollm2(smollm2_path, tmp_path):
    pytest.importorskip("reasoning_gym", reason="needs the [tasks] extra (reasoning-gym)")
    recipe = load_experiment("experiments/smollm2_tasks.py")
    graph, _ = build_graph(recipe, [
        f'config:base(task="{SOURCE}", settings={{"min_value": 1, "max_value": 20}}, model="{smollm2_path}")',
        "fiddler:smoke", "fiddler:local", "fiddler:no_tracking"])
    common.quiet(graph)
    graph.output_dir = str(tmp_path / "out")
    metrics = run_experiment(graph)["grpo"]["metrics"]
    strict, lenient = metrics[f"val-core/{SOURCE}/reward/mean@1"], metrics[f"val-aux/{SOURCE}/lenient/mean@1"]
    assert 0.0 <= strict <= lenient <= 1.0  # right in the asked-for form is also right format aside
    # the training reward reports how much of it came only from the half credit for an unformatted right answer
    assert 0.0 <= metrics[f"reward/extra/{SOURCE}/partial/mean"] <= 1.0
    assert metrics["response_length/mean"] <= 8  # the smoke fiddler's limit
