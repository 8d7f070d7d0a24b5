"""RL-stage features in real runs on the tiny model (LocalRuntime, per-step metrics): the critic
warm-up, the entropy bonus, a reward model's score in the reward, and the adaptive KL controller
across a checkpoint and resume. Each test fails when its feature is switched off or broken."""

from pathlib import Path

import fiddle as fdl
import pytest
import torch
from transformers import AutoModelForCausalLM

from helpers import tiny_model_path, tiny_reward_model
from rlhf.algos import AdaptiveKLController, PPOClipLoss
from rlhf.data.generators import arithmetic_rows
from rlhf.data.prompts import PromptDataset
from rlhf.data.tokenize import chat_prompt_ids
from rlhf.models.loading import load_tokenizer
from rlhf.rewards.arithmetic import digit_match_score
from rlhf.rewards.manager import RewardManager
from rlhf.rollout.sampling import SamplingParams
from rlhf.runtime.local import LocalRuntime
from rlhf.runtime.plan import bind_groups, compile_graph
from rlhf.trainers.context import StageContext
from rlhf.trainers.records import read_records
from rlhf.trainers.rl import RLTrainer
from rlhf.workers.objectives import PolicyObjective
from rlhf.workers.reward_model import RewardModelWorker, conversation_ids
from rlhf.workers.training import TrainingSetup
from rlhf_configs.algorithms import use_gae_with_critic
from rlhf_configs.pieces import policy_group
from rlhf_configs.tasks import use_reward_model
import rlhf_configs.common as common


def rl_stage(**trainer) -> fdl.Config:
    """GRPO on the tiny model: 4 prompts x 4 samples per step, partial-credit reward, AdamW 1e-3."""
    model = tiny_model_path()
    tok = fdl.Config(load_tokenizer, model)
    objective = fdl.Config(PolicyObjective, policy_loss=fdl.Config(PPOClipLoss))
    return fdl.Config(
        RLTrainer,
        policy=policy_group(model_path=model, ref_model_path=model, objective=objective,
                            optimizer=fdl.Partial(torch.optim.AdamW, lr=1e-3),
                            training=fdl.Config(TrainingSetup, micro_batch_size=16)),
        tokenizer=tok,
        train_data=fdl.Config(PromptDataset, rows=fdl.Config(arithmetic_rows, n=32), tokenizer=tok),
        reward=fdl.Config(RewardManager, scorers={"arithmetic": digit_match_score}),
        sampling=fdl.Config(SamplingParams, n=4, max_new_tokens=6),
        prompts_per_step=4,
        **{"total_steps": 3, **trainer},
    )


def run(stage: fdl.Config, out_dir: Path, resume: bool = False, watch=None) -> dict[int, dict]:
    """Run the stage as the experiment runner does (LocalRuntime); each step's metrics, plus
    `watch(trainer)`'s value under "watched" when given (called right after each step)."""
    plan = compile_graph(stage)
    runtime = LocalRuntime()
    groups = runtime.start_groups(plan)
    steps: dict[int, dict] = {}
    try:
        trainer = fdl.build(bind_groups(plan.driver, groups))

        def log(metrics, step):
            steps[step] = dict(metrics, **({"watched": watch(trainer)} if watch else {}))

        trainer.run(StageContext(out_dir=out_dir, log=log, progress=False, resume=resume))
    finally:
        runtime.shutdown()
    return steps


def policy_weights(trainer) -> dict[str, torch.Tensor]:
    return trainer.policy.parameters_digest()[0]


def test_the_actor_trains_only_after_the_critic_warm_up(tmp_path):
    stage = rl_stage(critic_warmup=2)
    use_gae_with_critic(stage, critic_lr=1e-3)
    stage.sampling.n = 1
    initial = AutoModelForCausalLM.from_pretrained(tiny_model_path()).state_dict()
    steps = run(stage, tmp_path, watch=policy_weights)
    for step in (1, 2):  # warm-up: the critic trains, the actor is left alone
        assert "critic/vf_loss" in steps[step] and "actor/pg_loss" not in steps[step]
        assert all(torch.equal(steps[step]["watched"][k], initial[k]) for k in initial), step
    assert "actor/pg_loss" in steps[3] and steps[3]["actor/grad_norm"] > 0
    assert any(not torch.equal(steps[3]["watched"][k], initial[k]) for k in initial)


def test_the_entropy_bonus_keeps_the_policy_more_random(tmp_path):
    """Same seeds, same data: with entropy_coef the policy's entropy ends higher than without (the random
    tiny model starts near the maximum, ln 259 = 5.557 nats: 5.5529 against 5.5495 when measured)."""
    def final_entropy(coef, folder):
        stage = rl_stage(total_steps=4)
        stage.policy.worker.objective.entropy_coef = coef
        return run(stage, tmp_path / folder)[4]["actor/entropy"]

    assert final_entropy(0.5, "bonus") > final_entropy(0.0, "plain") + 1e-3


def test_a_reward_model_score_is_added_to_each_rows_rule_score(tmp_path):
    """Every recorded sample's score is rule + 0.5 x the reward model's score of that very sample,
    recomputed here outside the run (so a row scored for another row's response is caught)."""
    stage = rl_stage(total_steps=2)  # rollouts are recorded by default
    use_reward_model(stage, tiny_reward_model(), weight=0.5, max_length=256)
    steps = run(stage, tmp_path)
    assert steps[2]["reward/model/mean"] != 0
    assert steps[2]["critic/score/mean"] == pytest.approx(
        steps[2]["reward/rule/mean"] + 0.5 * steps[2]["reward/model/mean"], abs=1e-5)

    policy_tok = load_tokenizer(tiny_model_path())
    messages = {policy_tok.decode(chat_prompt_ids(policy_tok, row["prompt"])): row["prompt"]
                for row in arithmetic_rows(32)}
    rm = RewardModelWorker(tiny_reward_model(), max_length=256)
    records = read_records(tmp_path)
    assert len(records) == 2 * 16
    ids = [conversation_ids(rm.tokenizer, messages[r["prompt"]], r["response"], 256) for r in records]
    rm_scores = rm.score_ids(ids).tolist()
    for record, rm_score in zip(records, rm_scores):
        rule = digit_match_score(record["response"], record["ground_truth"])
        assert record["score"] == pytest.approx(rule + 0.5 * rm_score, abs=1e-5), record
        # each part of the score is in the record: how much came from the reward model
        assert record["reward_extra"]["rule/score"] == pytest.approx(rule, abs=1e-6)
        assert record["reward_extra"]["model/score"] == pytest.approx(rm_score, abs=1e-5)


def unscored_rows(n: int) -> list[dict]:
    """Arithmetic prompts of a data source no scorer knows."""
    return [{**row, "data_source": "no-scorer-for-this"} for row in arithmetic_rows(n)]


def test_the_reward_model_fiddler_trains_on_the_reward_model_alone(tmp_path):
    """`fiddler:reward_model(path=..., weight=2.0, rule_weight=0)`: the score is 2 x the reward model's, the
    rule is still reported beside it; with no rule reward at all (reward=None) no scorer is needed."""
    stage = rl_stage(total_steps=1)
    common.reward_model(stage, path=tiny_reward_model(), weight=2.0, rule_weight=0.0, max_length=256)
    assert stage.reward_model.worker.model_path == tiny_reward_model() and stage.rule_weight == 0.0
    steps = run(stage, tmp_path)
    records = read_records(tmp_path)
    assert records and all(r["score"] == pytest.approx(2.0 * r["reward_extra"]["model/score"], abs=1e-5)
                           for r in records)
    assert all("rule/score" in r["reward_extra"] for r in records) and "reward/rule/mean" in steps[1]  # reported

    stage = rl_stage(total_steps=1)
    stage.reward = None
    stage.train_data.rows = fdl.Config(unscored_rows, n=32)
    common.reward_model(stage, path=tiny_reward_model(), weight=2.0, max_length=256)
    steps = run(stage, tmp_path / "rm_only")
    assert "reward/rule/mean" not in steps[1]
    assert steps[1]["critic/score/mean"] == pytest.approx(2.0 * steps[1]["reward/model/mean"], abs=1e-5)
    records = read_records(tmp_path / "rm_only")
    assert all(set(r["reward_extra"]) == {"model/score"} for r in records)


def test_an_rl_stage_without_rule_or_reward_model_is_refused():
    stage = rl_stage()
    stage.reward = None
    with pytest.raises(ValueError, match="reward=None needs a reward model"):
        run(stage, Path("/nonexistent"))


def test_the_adaptive_kl_coefficient_continues_after_a_resume(tmp_path):
    """Stopped after step 2 and resumed, step 3 runs with the coefficient the uninterrupted run had."""
    def stage(total_steps):
        return rl_stage(total_steps=total_steps, save_freq=1,
                        kl_in_reward=fdl.Config(AdaptiveKLController, init_coef=0.1, target_kl=1e-3, horizon=20))

    straight = run(stage(3), tmp_path / "straight")
    coefs = [straight[s]["actor/reward_kl_penalty_coeff"] for s in (1, 2, 3)]
    assert len(set(coefs)) == 3  # it moves every step (KL 0 at step 1, then above the target)
    run(stage(2), tmp_path / "resumed")
    resumed = run(stage(3), tmp_path / "resumed", resume=True)
    assert list(resumed) == [3]
    assert resumed[3]["actor/reward_kl_penalty_coeff"] == coefs[2]
    assert resumed[3]["actor/reward_kl_penalty"] == pytest.approx(straight[3]["actor/reward_kl_penalty"], rel=1e-6)
