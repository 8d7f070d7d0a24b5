"""`fiddler:distill` and `use_distillation`: on-policy distillation put into any RL recipe by three graph nodes."""

import fiddle as fdl

from helpers import load_file
from rlhf.algos import GRPO, OnPolicyDistillation, TopKForwardKL
from rlhf.cli.experiment import build_graph
from rlhf.runtime.plan import compile_graph
from rlhf_configs.algorithms import use_distillation


def test_the_fiddler_sets_the_teacher_the_estimator_and_the_top_k_loss():
    recipe = load_file("experiments/arithmetic_tiny.py")
    graph, applied = build_graph(recipe, ['fiddler:distill(teacher="/models/teacher", task_reward=True, top_k=8)'])
    assert applied
    rl = graph.stages["grpo"]
    assert rl.policy.worker.teacher_model_path == "/models/teacher"
    assert fdl.get_callable(rl.advantage) is OnPolicyDistillation
    assert fdl.get_callable(rl.advantage.task) is GRPO  # the recipe's own estimator, kept as the task term
    assert fdl.get_callable(rl.policy.worker.objective.distill_loss) is TopKForwardKL
    assert rl.policy.worker.objective.distill_loss.k == 8
    assert "policy" in compile_graph(rl).groups
    # applied again: the task estimator the first application kept is reused, never wrapped in a second OPD
    use_distillation(rl, "/models/other", distill_coef=0.5, task_reward=True)
    assert fdl.get_callable(rl.advantage.task) is GRPO and rl.advantage.distill_coef == 0.5
    assert rl.policy.worker.teacher_model_path == "/models/other"
    use_distillation(rl, "/models/other")  # pure OPD
    assert rl.advantage.task is None
