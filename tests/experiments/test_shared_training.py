"""One TrainingSetup node per stage: the critic and the reward model get the policy's node itself, so an
override made after the fiddler that added them (`set:`, gin, `fiddler:fsdp`) reaches every role."""

import fiddle as fdl
import pytest

import rlhf_configs.common as common
from rlhf.config.gin_overrides import apply_gin
from rlhf.config.overrides import apply_set
from rlhf.runtime.plan import compile_graph
from rlhf.runtime.preflight_hooks import hook_problems
from rlhf.workers.training import TrainingSetup
from rlhf_configs.tasks import use_reward_model
from tests.experiments.test_build_all import EXPERIMENTS, load


@pytest.fixture
def ppo():
    """The GSM8K PPO recipe (use_gae_with_critic) on the tiny model, with a reward model beside it."""
    recipe = load(next(p for p in EXPERIMENTS if p.stem == "qwen_gsm8k_ppo"))
    cfg = recipe.base()
    recipe.tiny(cfg)
    use_reward_model(cfg.stages["ppo"], model_path="/rm")
    return cfg


def _plan_training(cfg, group: str) -> TrainingSetup:
    """The TrainingSetup a group's workers build, as the compiled plan carries it."""
    return fdl.build(compile_graph(cfg.stages["ppo"]).worker_arguments(group)["training"])


def test_the_critic_and_reward_model_share_the_policy_node(ppo):
    stage = ppo.stages["ppo"]
    assert stage.critic.worker.training is stage.policy.worker.training
    assert stage.reward_model.worker.training is stage.policy.worker.training


def test_a_later_set_on_the_policy_reaches_the_critic_and_reward_model(ppo):
    apply_set(ppo, "stages.ppo.policy.worker.training.micro_batch_size=8")
    apply_set(ppo, "stages.ppo.policy.worker.training.mini_batches=2")
    for group in ("policy", "critic", "reward_model"):
        built = _plan_training(ppo, group)
        assert (built.micro_batch_size, built.mini_batches) == (8, 2), group


def test_gin_and_fsdp_fiddler_set_every_role_once(ppo):
    apply_gin(ppo, text="TrainingSetup.epochs = 2")
    common.fsdp(ppo)
    for group in ("policy", "critic", "reward_model"):
        built = _plan_training(ppo, group)
        assert (built.epochs, built.strategy) == (2, "fsdp"), group


def test_fsdp_fiddler_gives_a_default_worker_its_own_node():
    from rlhf.workers.policy import PolicyWorker

    cfg = fdl.Config(dict, policy=fdl.Config(PolicyWorker, model_path="/m"))
    common.fsdp(cfg)
    assert fdl.build(cfg.policy.training) == TrainingSetup(strategy="fsdp")


def test_a_float16_compute_dtype_on_the_shared_node_fails_the_critics_preflight_too(ppo):
    ppo.stages["ppo"].policy.worker.training.compute_dtype = "float16"
    problems = "\n".join(hook_problems(ppo))
    assert "critic.worker" in problems and "policy.worker" in problems and "float16" in problems
