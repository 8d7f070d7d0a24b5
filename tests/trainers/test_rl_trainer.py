"""RLTrainer guards: NaN gradients stop the run after K steps with the weights untouched; bad setups
are refused before training."""

import functools

import fiddle as fdl
import pytest
import torch
from safetensors.torch import load_file

from rlhf.algos import GAE, GRPO, RLOO, DynamicSamplingAccumulator, OptimalTokenBaseline, ReMax
from rlhf.algos.requirements import NEEDS
from rlhf.runtime.preflight import check_experiment
from rlhf.data.generators import arithmetic_rows
from rlhf.data.prompts import PromptDataset
from rlhf.models.loading import load_tokenizer
from rlhf.rewards.arithmetic import exact_match_score
from rlhf.rewards.manager import RewardManager
from rlhf.rollout.sampling import SamplingParams
from rlhf.runtime.experiment import Experiment, run_experiment
from rlhf.runtime.local import LocalRuntime
from rlhf.trainers.export import export_checkpoint
from rlhf.trainers.rl import NonFiniteTrainingError, RLTrainer
from rlhf_configs.pieces import policy_group
from rlhf.workers.training import TrainingSetup
from helpers import tiny_model_path
from nan_objective import NaNObjective


def experiment(tmp_path, objective, **trainer):
    model = tiny_model_path()
    tok = fdl.Config(load_tokenizer, model)
    stage = fdl.Config(
        RLTrainer,
        policy=policy_group(model_path=model, objective=objective, training=fdl.Config(TrainingSetup, micro_batch_size=8)),
        tokenizer=tok,
        train_data=fdl.Config(PromptDataset, rows=fdl.Config(arithmetic_rows, n=16), tokenizer=tok),
        reward=fdl.Config(RewardManager, scorers={"arithmetic": exact_match_score}),
        sampling=fdl.Config(SamplingParams, n=2, max_new_tokens=4),
        prompts_per_step=4,
        total_steps=10,
        **trainer,
    )
    return fdl.Config(Experiment, name="guards", stages={"rl": stage}, runtime=fdl.Config(LocalRuntime),
                      output_dir=str(tmp_path), progress=False)


def test_nan_gradients_stop_the_run_and_never_touch_the_weights(tmp_path):
    graph = experiment(tmp_path, fdl.Config(NaNObjective), save_freq=1, max_nonfinite_steps=3)
    with pytest.raises(NonFiniteTrainingError, match="NaN/Inf in 3 consecutive steps"):
        run_experiment(graph)
    (ckpt_root,) = list(tmp_path.glob("guards/*/rl/checkpoints"))
    exported = export_checkpoint(str(sorted(ckpt_root.iterdir())[-1]), str(tmp_path / "exported"))
    saved = load_file(f"{exported}/model.safetensors")
    initial = load_file(f"{tiny_model_path()}/model.safetensors")
    for k, v in saved.items():
        assert torch.equal(v, initial[k]), f"{k} changed although every gradient was NaN"


def test_rl_stages_record_rollouts_by_default(tmp_path):
    from rlhf.algos import PPOClipLoss
    from rlhf.trainers.records import read_records
    from rlhf.workers.objectives import PolicyObjective

    objective = fdl.Config(PolicyObjective, policy_loss=fdl.Config(PPOClipLoss))
    graph = experiment(tmp_path, objective)
    graph.stages["rl"].total_steps = 2
    run_experiment(graph)
    (stage,) = tmp_path.glob("guards/*/rl")
    rows = read_records(stage)
    assert {r["step"] for r in rows} == {1, 2} and len(rows) == 2 * 4 * 2  # every group: 4 prompts x n=2
    assert all(r["response"] is not None and r["prompt"] for r in rows)


def trainer(advantage, n=8, **kw):
    return RLTrainer(None, None, PromptDataset(arithmetic_rows(4), load_tokenizer(tiny_model_path())),
                     RewardManager({"arithmetic": exact_match_score}), advantage=advantage,
                     sampling=SamplingParams(n=n), **kw)


@pytest.mark.parametrize("estimator", sorted(NEEDS, key=lambda c: c.__name__), ids=lambda c: c.__name__)
def test_the_trainer_and_preflight_refuse_the_same_setups(estimator):
    """Both read rlhf.algos.requirements: every estimator with n=1 and no critic is refused by the
    trainer exactly when preflight reports it, with the same message."""
    graph_errors = check_experiment(fdl.Config(Experiment, name="x", stages={"rl": fdl.Config(
        RLTrainer, advantage=fdl.Config(estimator), sampling=fdl.Config(SamplingParams, n=1))}),
        cpus=1, gpus=0).errors
    graph_errors = [e for e in graph_errors if "needs `" not in e]  # unset policy, tokenizer...: not the point
    if NEEDS[estimator].min_samples > 1 or NEEDS[estimator].critic:
        with pytest.raises(ValueError) as err:
            trainer(estimator(), n=1)
        assert len(graph_errors) == 1
        assert graph_errors[0].split(": ", 1)[1].split(" Fix:")[0] in str(err.value)
    else:
        trainer(estimator(), n=1)
        assert graph_errors == []


def test_group_estimators_with_one_sample_per_prompt_are_refused():
    for estimator in (GRPO(), RLOO(), OptimalTokenBaseline()):
        with pytest.raises(ValueError, match="compares the samples of each prompt, and n=1"):
            trainer(estimator, n=1)
    with pytest.raises(ValueError, match="dynamic sampling keeps the prompts"):
        trainer(ReMax(), n=1, dynamic_sampling=functools.partial(DynamicSamplingAccumulator, max_attempts=2))


def test_gae_without_a_critic_is_refused():
    with pytest.raises(ValueError, match="needs a critic"):
        trainer(GAE())
