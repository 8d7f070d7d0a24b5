"""The distillation recipe end to end on SmolLM2: its smoke makes a teacher with the task recipe (one GRPO step)
and distils it into a fresh copy of the instruct model (two OPD steps), the teacher scoring every sampled token."""

import pytest

import rlhf_configs.common as common
from rlhf.cli.experiment import build_graph, load_experiment
from rlhf.runtime.experiment import run_experiment
from rlhf.trainers.rl import RLTrainer


@pytest.mark.real_model
def test_smoke_makes_a_teacher_and_distils_it_on_smollm2(smollm2_path, tmp_path, monkeypatch):
    recipe = load_experiment("experiments/smollm2_distill.py")
    graph, _ = build_graph(recipe, [f'config:base(student="{smollm2_path}")', "fiddler:smoke", "fiddler:local",
                                    "fiddler:no_tracking"])
    common.quiet(graph)
    graph.output_dir = str(tmp_path / "out")
    seen = []
    step = RLTrainer.step

    def spy(self, *args):
        metrics, batch = step(self, *args)
        seen.append((metrics, batch))
        return metrics, batch

    monkeypatch.setattr(RLTrainer, "step", spy)
    results = run_experiment(graph)
    assert list(results) == ["teacher", "base", "distill", "test"]
    distilled = seen[1:]  # the teacher stage's one step first
    assert len(distilled) == 2
    for metrics, batch in distilled:
        assert "teacher_log_probs" in batch and metrics["distill/teacher_log_prob"] < 0
        assert metrics["distill/reverse_kl_k3"] >= 0
    assert 0.0 <= results["distill"]["metrics"]["val-aux/arithmetic/lenient/mean@1"] <= 1.0
    # the test rows measured the instruct model and the distilled weights
    for stage in ("base", "test"):
        assert 0.0 <= results[stage]["metrics"]["val-core/arithmetic/reward/mean@1"] <= 1.0
    assert graph.stages["test"].policy.worker.model_path.stage == "distill"
