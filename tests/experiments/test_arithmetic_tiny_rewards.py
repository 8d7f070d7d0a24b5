"""arithmetic_tiny: the RL reward and validation are separate nodes, so changing what RL optimises on the
command line never changes what the evaluators measure (they shared one node, and replacing the training
scorers silently changed validation)."""

from rlhf.config.overrides import apply_overrides
from rlhf.rewards.arithmetic import exact_match_score
from helpers import load_file


def test_set_on_the_training_reward_leaves_every_evaluator_alone():
    module = load_file("experiments/arithmetic_tiny.py")
    graph, _ = apply_overrides(
        ["set:stages.grpo.reward.scorers={}", "set:stages.grpo.reward.overlong_buffer_len=4"], [module])
    assert graph.stages["grpo"].reward.scorers == {} and graph.stages["grpo"].reward.overlong_buffer_len == 4
    for name, stage in graph.stages.items():
        assert stage.evaluator.reward.scorers == {"arithmetic": exact_match_score}, name
        assert stage.evaluator.reward.overlong_buffer_len is None, name


def test_validation_is_one_node_for_every_stage():
    """One validation metric across SFT, GRPO and eval: a change to it reaches all three evaluators."""
    module = load_file("experiments/arithmetic_tiny.py")
    graph, _ = apply_overrides(["set:stages.sft.evaluator.reward.scorers={}"], [module])
    assert all(stage.evaluator.reward.scorers == {} for stage in graph.stages.values())
    assert graph.stages["grpo"].reward.scorers == {"arithmetic": exact_match_score}
