"""The training time budget (`max_train_minutes`): the step that spends it is the stage's last (validated,
checkpointed, reported as stopped early); the spent time survives a checkpoint, so a resumed run trains only for
what is left and one resumed after the budget was spent takes no steps. Real runs on the tiny model."""

from pathlib import Path

import fiddle as fdl
import pytest
import torch

from helpers import tiny_model_path
from rlhf.algos import PPOClipLoss
from rlhf.data.generators import arithmetic_rows
from rlhf.data.prompts import PromptDataset
from rlhf.data.sft import SFTDataset
from rlhf.models.loading import load_tokenizer
from rlhf.rewards.arithmetic import digit_match_score
from rlhf.rewards.manager import RewardManager
from rlhf.rollout.sampling import SamplingParams
from rlhf.runtime.local import LocalRuntime
from rlhf.runtime.plan import bind_groups, compile_graph
from rlhf.trainers.context import StageContext
from rlhf.trainers.evaluate import Evaluator
from rlhf.trainers.rl import RLTrainer
from rlhf.trainers.sft import SFTTrainer
from rlhf.trainers.time_budget import TimeBudget
from rlhf.workers.objectives import PolicyObjective, SFTObjective
from rlhf.workers.training import TrainingSetup
from rlhf_configs.pieces import policy_group

SPENT_AT_ONCE = 1e-9  # minutes: any step spends it


@pytest.mark.parametrize("minutes, steps_s, exhausted", [
    (None, [1e9], False),          # no budget: never spent
    (1.0, [], False),
    (1.0, [59.9], False),
    (1.0, [30.0, 30.0], True),     # exactly the budget: spent
    (1.0, [30.0, 29.0], False),
    (0.5, [10.0, 10.0, 10.5], True),
])
def test_the_budget_is_spent_by_the_steps_own_time(minutes, steps_s, exhausted):
    budget = TimeBudget(minutes)
    for s in steps_s:
        logged = budget.spend({"timing_s/step": s, "timing_s/gen": 99.0})  # only the step's total counts
    assert budget.exhausted is exhausted
    if steps_s:
        assert logged == {"timing_s/train_total": pytest.approx(sum(steps_s))}


def test_the_budget_says_it_stopped_the_stage_only_when_it_did():
    budget = TimeBudget(1.0)
    budget.spend({"timing_s/step": 61.0})
    assert budget.stopped_early(3, 10) == {"stopped_early": {
        "reason": "max_train_minutes=1.0 spent", "step": 3, "total_steps": 10, "train_minutes": 1.017}}
    assert budget.stopped_early(10, 10) == {}  # spent on the last step anyway: the stage ran to its end
    assert TimeBudget(None).stopped_early(3, 10) == {} and TimeBudget(5.0).stopped_early(3, 10) == {}
    again = TimeBudget(1.0)
    again.load_state_dict(budget.state_dict())
    assert again.exhausted and again.spent_s == 61.0
    again.load_state_dict({})  # a checkpoint written before budgets existed: nothing spent
    assert again.spent_s == 0.0


@pytest.mark.parametrize("minutes", [0, -1.0])
def test_a_budget_of_no_time_is_refused(minutes):
    with pytest.raises(ValueError, match="above 0 minutes"):
        TimeBudget(minutes)


def rl_stage(**trainer) -> fdl.Config:
    """GRPO on the tiny model, 4 prompts x 2 samples of 4 tokens, greedy validation on 4 held-out prompts."""
    model = tiny_model_path()
    tok = fdl.Config(load_tokenizer, model)
    return fdl.Config(
        RLTrainer,
        policy=policy_group(model_path=model, objective=fdl.Config(PolicyObjective, policy_loss=fdl.Config(PPOClipLoss)),
                            optimizer=fdl.Partial(torch.optim.AdamW, lr=1e-3),
                            training=fdl.Config(TrainingSetup, micro_batch_size=8)),
        tokenizer=tok,
        train_data=fdl.Config(PromptDataset, rows=fdl.Config(arithmetic_rows, n=16), tokenizer=tok),
        reward=fdl.Config(RewardManager, scorers={"arithmetic": digit_match_score}),
        sampling=fdl.Config(SamplingParams, n=2, max_new_tokens=4),
        prompts_per_step=4,
        evaluator=fdl.Config(Evaluator, dataset=fdl.Config(PromptDataset, rows=fdl.Config(arithmetic_rows, n=4, split="test"),
                                                           tokenizer=tok),
                             reward=fdl.Config(RewardManager, scorers={"arithmetic": digit_match_score}),
                             sampling=fdl.Config(SamplingParams, temperature=0.0, max_new_tokens=4), n_boot=0),
        records=None,
        **trainer,
    )


def run(stage: fdl.Config, out_dir: Path, resume: bool = False) -> tuple[dict[int, dict], dict]:
    """The stage run as the experiment runner runs it (LocalRuntime): each step's metrics and the result."""
    plan = compile_graph(stage)
    runtime = LocalRuntime()
    groups = runtime.start_groups(plan)
    steps: dict[int, dict] = {}
    try:
        trainer = fdl.build(bind_groups(plan.driver, groups))
        result = trainer.run(StageContext(out_dir=out_dir, log=lambda m, s: steps.setdefault(s, {}).update(m),
                                          progress=False, resume=resume))
    finally:
        runtime.shutdown()
    return steps, result


def test_an_rl_stage_stops_after_the_step_that_spends_its_budget(tmp_path):
    steps, result = run(rl_stage(total_steps=5, save_freq=10, max_train_minutes=SPENT_AT_ONCE), tmp_path)
    assert list(steps) == [1]
    assert "val-core/arithmetic/reward/mean@1" in steps[1]  # validated as the last step
    assert steps[1]["timing_s/train_total"] == pytest.approx(steps[1]["timing_s/step"])
    assert result["stopped_early"]["step"] == 1 and result["stopped_early"]["total_steps"] == 5
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step_00000001"]  # checkpointed as the last
    assert (tmp_path / "final").is_dir()

    resumed, again = run(rl_stage(total_steps=5, save_freq=10, max_train_minutes=SPENT_AT_ONCE), tmp_path,
                         resume=True)
    assert resumed == {}  # the checkpoint's run had spent the budget: no more steps
    assert again["stopped_early"]["step"] == 1


def test_a_resumed_rl_stage_counts_the_time_spent_before_it(tmp_path):
    straight, result = run(rl_stage(total_steps=2, save_freq=1, max_train_minutes=60.0), tmp_path)
    assert "stopped_early" not in result  # a budget it does not reach changes nothing
    resumed, _ = run(rl_stage(total_steps=3, save_freq=1, max_train_minutes=60.0), tmp_path, resume=True)
    assert list(resumed) == [3]
    spent = straight[1]["timing_s/step"] + straight[2]["timing_s/step"] + resumed[3]["timing_s/step"]
    assert resumed[3]["timing_s/train_total"] == pytest.approx(spent)


def test_an_sft_stage_stops_after_the_step_that_spends_its_budget(tmp_path):
    tok = load_tokenizer(tiny_model_path())
    data = SFTDataset(arithmetic_rows(8), tok)
    group = policy_group(model_path=tiny_model_path(), objective=fdl.Config(SFTObjective),
                         training=fdl.Config(TrainingSetup, micro_batch_size=4))
    runtime = LocalRuntime()
    policy = runtime.start_groups(compile_graph(group))["policy"]
    steps: dict[int, dict] = {}
    try:
        trainer = SFTTrainer(policy, data, batch_size=4, total_steps=4, val_data=data, save_freq=10,
                             max_train_minutes=SPENT_AT_ONCE)
        result = trainer.run(StageContext(out_dir=tmp_path, log=lambda m, s: steps.setdefault(s, {}).update(m),
                                          progress=False))
    finally:
        runtime.shutdown()
    assert list(steps) == [1] and "val/sft_loss" in steps[1]  # validated as the last step
    assert result["stopped_early"]["step"] == 1 and (tmp_path / "checkpoints" / "step_00000001").is_dir()


def test_an_asynchronous_rl_stage_stops_cleanly_with_rollouts_still_queued(tmp_path):
    """One step off: the producer has the next batch ready when the budget ends the stage; closing it must not
    hang or fail, and the stage's result says where it stopped."""
    from test_async_rollout import graph
    from rlhf.runtime.experiment import run_experiment
    from rlhf_configs.async_rollout import use_async_rollout

    g = graph(tmp_path / "out", steps=4, max_train_minutes=SPENT_AT_ONCE)
    use_async_rollout(g.stages["rl"], max_staleness=1, weights="fixed_lag", transport="object_store",
                      correction="decoupled")
    result = run_experiment(g)["rl"]
    assert result["stopped_early"]["step"] == 1
    assert [p.name for p in (tmp_path / "out" / "async" / "run" / "rl" / "checkpoints").iterdir()] == ["step_00000001"]
