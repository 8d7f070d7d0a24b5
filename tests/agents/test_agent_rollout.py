"""The agent loop: environments that fail or hang cost only their rollout, steps run concurrently, the
limits end conversations, and with the real engine every sampled token keeps the log-prob the trainer
recomputes over the whole multi-turn sequence (token-in/token-out), so the loss trains exactly them."""

import asyncio
import functools
import time

import pytest
import torch

from rlhf.agents import AgentRollout, PythonCallParser, StepResult, ToolEnvironment
from rlhf.algos import GRPO, PPOClipLoss, group_ids_from_uids
from rlhf.algos.advantages import AdvantageInputs
from rlhf.batch import Batch
from rlhf.data.prompts import PromptDataset
from rlhf.models.loading import load_tokenizer
from rlhf.rollout.hf_engine import HFEngine
from rlhf.rollout.sampling import SamplingParams
from rlhf.workers.objectives import PolicyObjective
from rlhf.workers.policy import PolicyWorker
from scripted import ScriptedPolicy
from test_trajectory import add, tokenizer

QUESTIONS = {  # what the environment does when this row steps
    "ok": "What is 1+2?", "raises": "What is 2+2?", "hangs": "What is 3+3?", "reset fails": "What is 4+4?",
    "async hangs": "What is 5+5?", "bad result": "What is 6+6?",
}


class MoodyEnvironment(ToolEnvironment):
    """A tool environment whose steps misbehave on some rows."""

    def reset(self, row):
        self.mood = next(k for k, q in QUESTIONS.items() if q == row["raw_prompt"][0]["content"])
        if self.mood == "reset fails":
            raise ConnectionError("no sandbox")
        return super().reset(row)

    async def step(self, action):
        if self.mood == "raises":
            raise RuntimeError("the environment broke")
        if self.mood == "hangs":
            time.sleep(30)  # a blocking hang: runs in its own thread, abandoned after the timeout
        if self.mood == "async hangs":
            await asyncio.sleep(30)
        if self.mood == "bad result":
            return "not a StepResult"
        return await super().step(action)


def prompts(tok, questions):
    rows = [{"data_source": "calc", "prompt": [{"role": "user", "content": q}],
             "reward_model": {"ground_truth": "3"}, "extra_info": {}} for q in questions]
    return PromptDataset(rows, tok, raw_prompt=True).collate(range(len(rows)))


def test_a_failing_or_hanging_environment_costs_only_its_rollout():
    tok = tokenizer()
    policy = ScriptedPolicy(tok, {q: ["add(1, 2)", "3"] for q in QUESTIONS.values()})
    agent = AgentRollout(environment=functools.partial(MoodyEnvironment, tools=[add]), tokenizer=tok,
                         parser=PythonCallParser(), step_timeout_s=0.5)
    started = time.perf_counter()
    batch, metrics = agent.rollout(policy.generate, prompts(tok, QUESTIONS.values()), SamplingParams(max_new_tokens=16))
    assert time.perf_counter() - started < 5  # the hangs cost their timeout, at the same time
    info = {mood: batch["extra_info"][i]["agent"] for i, mood in enumerate(QUESTIONS)}
    assert info["ok"]["finish_reason"] == "done" and info["ok"]["num_turns"] == 2
    for mood in ("raises", "hangs", "reset fails", "async hangs", "bad result"):
        assert info[mood]["finish_reason"] == "error", mood
        assert batch["response_mask"][list(QUESTIONS).index(mood)].sum() == 0, mood  # not trained on
    assert "RuntimeError: the environment broke" in info["raises"]["env_error"]
    assert "no answer within 0.5 s" in info["hangs"]["env_error"]
    assert "returned str, not StepResult" in info["bad result"]["env_error"]
    assert metrics["agent/env_errors"] == 5
    ok = list(QUESTIONS).index("ok")
    assert batch["response_mask"][ok].sum() == len(tok("add(1, 2)")["input_ids"]) + 1 + 2  # both turns, EOS each


class SlowEnvironment:
    """Every step takes 0.4 s (async): N rollouts' steps should overlap."""

    def reset(self, row):
        return list(row["raw_prompt"])

    async def step(self, action):
        await asyncio.sleep(0.4)
        return StepResult([{"role": "user", "content": "again"}], reward=1.0, done=action.turn == 2)


def test_environment_steps_run_concurrently_and_rewards_sum():
    tok = tokenizer()
    questions = [f"What is {i}+1?" for i in range(8)]
    policy = ScriptedPolicy(tok, {q: ["a", "b"] for q in questions})
    agent = AgentRollout(environment=SlowEnvironment, tokenizer=tok, parser=PythonCallParser())
    batch, metrics = agent.rollout(policy.generate, prompts(tok, questions), SamplingParams(max_new_tokens=8))
    assert metrics["timing_s/env"] < 1.6  # 16 steps of 0.4 s in two rounds of 8 at once (sequential: 6.4 s)
    assert [e["agent"]["reward"] for e in batch["extra_info"]] == [2.0] * 8
    assert metrics["agent/env_reward/mean"] == 2.0 and policy.calls == 2  # one generate per turn for all rows


def test_max_turns_ends_a_conversation_that_keeps_calling_tools():
    tok = tokenizer()
    question = "What is 1+2?"
    policy = ScriptedPolicy(tok, {question: ["add(1, 2)"] * 5})
    agent = AgentRollout(environment=functools.partial(ToolEnvironment, tools=[add]), tokenizer=tok,
                         parser=PythonCallParser(), max_turns=3)
    batch, metrics = agent.rollout(policy.generate, prompts(tok, [question]), SamplingParams(max_new_tokens=16))
    assert metrics["num_turns/max"] == 3 and metrics["agent/finish/max_turns"] == 1
    text = tok.decode(batch["responses"][0][batch["attention_mask"][0, batch["prompts"].shape[1]:].bool()])
    assert text.count("<|im_start|>tool") == 2  # the last turn's tool result is not appended: nothing follows it
    assert text.endswith("add(1, 2)<|im_end|>")


def test_per_row_tool_subset_and_metrics_per_turn():
    tok = tokenizer()
    rows = [{"data_source": "calc", "prompt": [{"role": "user", "content": q}], "reward_model": {"ground_truth": "3"},
             "extra_info": {"tools": tools}} for q, tools in (("What is 1+2?", ["add"]), ("What is 2+2?", []))]
    data = PromptDataset(rows, tok, raw_prompt=True)
    policy = ScriptedPolicy(tok, {"1+2": ["add(1, 2)", "3"], "2+2": ["add(2, 2)", "4!"]})
    agent = AgentRollout(environment=functools.partial(ToolEnvironment, tools=[add]), tokenizer=tok,
                         parser=PythonCallParser())
    batch, metrics = agent.rollout(policy.generate, data.collate([0, 1]), SamplingParams(max_new_tokens=16))
    assert "<|im_start|>tool\n3<|im_end|>" in tok.decode(batch["responses"][0])
    assert "error: unknown tool 'add'; available: " in tok.decode(batch["responses"][1])  # row 2 has no tools
    assert metrics["tool_errors/unknown_tool"] == 1 and metrics["tool_errors/rate"] == 0.5
    assert metrics["response_length/turn_1/mean"] == len(tok("add(1, 2)")["input_ids"]) + 1
    assert metrics["response_length/turn_2/mean"] == (2 + 3) / 2


class ContinueEnvironment:
    """Every answer gets a user message back; three turns in all."""

    def reset(self, row):
        return list(row["raw_prompt"])

    def step(self, action):
        return StepResult([{"role": "user", "content": f"And {action.turn}+1?"}], done=action.turn == 3)


def test_real_engine_log_probs_match_the_trainer_over_the_whole_multi_turn_sequence(eos_model):
    """Token-in/token-out with the transformers engine: the trainer's old log-probs, recomputed over
    prompt + every turn + every observation, equal the engine's on each sampled token: every turn was
    sampled from exactly the ids the trainer sees, and each log-prob sits on its own token. (That the
    ids are the ones the chat template gives at inference is what the golden trajectories pin.)"""
    tok = load_tokenizer(eos_model)
    engine = HFEngine(eos_model)
    agent = AgentRollout(environment=ContinueEnvironment, tokenizer=tok, max_turns=3, max_response_tokens=96)
    torch.manual_seed(0)
    batch, metrics = agent.rollout(engine.generate, prompts(tok, ["What is 12+30?", "What is 7+8?"]),
                                   SamplingParams(n=4, temperature=1.0, max_new_tokens=10))
    assert metrics["num_turns/mean"] > 2  # the conversations really are multi-turn
    mask = batch["response_mask"].bool()
    observed = batch["attention_mask"][:, batch["prompts"].shape[1]:].bool() & ~mask
    assert observed.sum() > 0
    worker = PolicyWorker(eos_model)
    old = worker.compute_log_probs(batch)["old_log_probs"]
    assert (old - batch["rollout_log_probs"]).abs()[mask].max() < 1e-4


def test_the_loss_counts_only_sampled_tokens(eos_model):
    """The policy loss and its token count see only the mask: observation tokens with any advantage, any
    log-prob give the same loss and gradient as with none."""
    tok = load_tokenizer(eos_model)
    agent = AgentRollout(environment=ContinueEnvironment, tokenizer=tok, max_turns=3, max_response_tokens=64)
    torch.manual_seed(1)
    batch, _ = agent.rollout(HFEngine(eos_model).generate, prompts(tok, ["What is 12+30?"]),
                             SamplingParams(n=4, temperature=1.0, max_new_tokens=10))
    scores = torch.tensor([1.0, 0.0, 0.5, 0.0])
    rewards = torch.zeros_like(batch["rollout_log_probs"])
    last = batch["response_mask"].shape[1] - 1 - batch["response_mask"].flip(1).argmax(1)
    rewards[torch.arange(4), last] = scores
    advantages, _ = GRPO()(AdvantageInputs(rewards, batch["response_mask"], group_ids_from_uids(batch["uid"])))
    assert (advantages[batch["response_mask"] == 0] == 0).all()
    batch["advantages"] = advantages
    objective = PolicyObjective(policy_loss=PPOClipLoss())
    log_probs = batch["rollout_log_probs"].clone().requires_grad_(True)
    loss, _ = objective(log_probs, None, batch, num_tokens=float(batch["response_mask"].sum()), num_seqs=4.0)
    loss.backward()
    tampered = Batch(dict(batch.tensors), dict(batch.non_tensors), dict(batch.meta))
    outside = batch["response_mask"] == 0
    tampered["advantages"] = batch["advantages"].masked_fill(outside, 5.0)
    garbage = batch["rollout_log_probs"].masked_fill(outside, -3.0).clone().requires_grad_(True)
    loss2, _ = objective(garbage, None, tampered, num_tokens=float(batch["response_mask"].sum()), num_seqs=4.0)
    loss2.backward()
    assert torch.allclose(loss, loss2) and torch.equal(log_probs.grad, garbage.grad)
    assert (log_probs.grad[outside] == 0).all() and (log_probs.grad[~outside] != 0).any()


def test_the_score_lands_on_the_last_sampled_token_not_in_a_tool_result():
    """score_rollout scores the final answer and puts the score on the last token of the mask (the final
    turn's EOS), so the outcome estimators, which sum rewards over the mask, see it."""
    from rlhf.rewards.arithmetic import exact_match_score
    from rlhf.rewards.manager import RewardManager
    from rlhf.trainers.scoring import score_rollout

    tok = tokenizer()
    questions = ["What is 1+2?", "What is 2+2?"]
    policy = ScriptedPolicy(tok, {"1+2": ["add(1, 2)", "3"], "2+2": ["add(2, 2)", "5"]})
    agent = AgentRollout(environment=functools.partial(ToolEnvironment, tools=[add]), tokenizer=tok,
                         parser=PythonCallParser())
    batch, _ = agent.rollout(policy.generate, prompts(tok, questions), SamplingParams(max_new_tokens=16))
    scored, _ = score_rollout(batch, tok, RewardManager(scorers={"calc": exact_match_score}))
    assert scored["scores"].tolist() == [1.0, 0.0]  # "3" is right for 1+2 (ground truth 3), "5" is not
    mask = batch["response_mask"]
    last = mask.shape[1] - 1 - mask.flip(1).argmax(1)
    assert scored["token_level_scores"][0, last[0]] == 1.0 and scored["token_level_scores"][0].sum() == 1.0
    advantages, _ = GRPO(norm_by_std=False)(AdvantageInputs(scored["token_level_scores"], mask,
                                                            group_ids_from_uids(["g", "g"])))
    assert advantages[0][mask[0].bool()].unique().tolist() == [0.5]  # the whole trajectory, every sampled token


def test_the_environment_can_own_the_reward():
    """A data source scored by `environment_reward` takes the environment's summed step rewards."""
    from rlhf.agents import environment_reward
    from rlhf.rewards.manager import RewardManager
    from rlhf.trainers.scoring import score_rollout

    tok = tokenizer()
    questions = [f"What is {i}+1?" for i in range(2)]
    agent = AgentRollout(environment=SlowEnvironment, tokenizer=tok, parser=PythonCallParser())
    batch, _ = agent.rollout(ScriptedPolicy(tok, {q: ["a", "b"] for q in questions}).generate,
                             prompts(tok, questions), SamplingParams(max_new_tokens=8))
    scored, _ = score_rollout(batch, tok, RewardManager(scorers={"calc": environment_reward}))
    assert scored["scores"].tolist() == [2.0, 2.0]  # 1.0 per step, two steps
    assert environment_reward("3", "3", {"agent": {"reward": None}}) == 0.0  # never rewarded: the default
    with pytest.raises(ValueError, match="not a multi-turn one"):
        environment_reward("3", "3", {})


def test_one_step_off_multi_turn_trains_on_the_conversations_of_two_versions_back(eos_model, tmp_path, monkeypatch):
    """The agent loop under asynchronous rollout (`fiddler:one_step_off`): the rollout group runs every turn
    of batch k with the weights of version max(0, k-2), the batch carries that version, and each sampled
    token's log-prob is that version's over the whole multi-turn sequence (read back from the checkpoints)."""
    import fiddle as fdl

    from rlhf.algos import GRPO as GRPOConfig
    from rlhf.data.generators import arithmetic_rows
    from rlhf.models.loading import load_causal_lm
    from rlhf.rewards.arithmetic import digit_match_score
    from rlhf.rewards.manager import RewardManager
    from rlhf.runtime.experiment import Experiment
    from rlhf.runtime.local import LocalRuntime
    from rlhf.trainers.export import export_checkpoint
    from rlhf.trainers.rl import RLTrainer
    from rlhf.workers.policy import response_log_probs
    from rlhf.workers.training import TrainingSetup
    from helpers import run_capturing
    from rlhf_configs import common
    from rlhf_configs.pieces import policy_group

    tok = fdl.Config(load_tokenizer, eos_model)
    stage = fdl.Config(
        RLTrainer,
        policy=policy_group(model_path=eos_model, objective=fdl.Config(PolicyObjective, entropy_coef=0.5),
                            optimizer=fdl.Partial(torch.optim.AdamW, lr=3e-2),
                            training=fdl.Config(TrainingSetup, micro_batch_size=8)),
        tokenizer=tok,
        train_data=fdl.Config(PromptDataset, rows=fdl.Config(arithmetic_rows, n=16), tokenizer=tok, raw_prompt=True),
        reward=fdl.Config(RewardManager, scorers={"arithmetic": digit_match_score}),
        advantage=fdl.Config(GRPOConfig),
        sampling=fdl.Config(SamplingParams, n=2, max_new_tokens=8),
        rollout=fdl.Config(AgentRollout, environment=ContinueEnvironment, tokenizer=tok, max_turns=3,
                           max_response_tokens=64),
        prompts_per_step=2, total_steps=4, save_freq=1, keep_checkpoints=4,
    )
    g = fdl.Config(Experiment, name="agent_async", stages={"rl": stage}, runtime=fdl.Config(LocalRuntime),
                   output_dir=str(tmp_path / "out"), run_name="run", progress=False)
    common.one_step_off(g)
    seen = run_capturing(monkeypatch, g)

    checkpoints = tmp_path / "out" / "agent_async" / "run" / "rl" / "checkpoints"
    for k, (metrics, batch) in seen.items():
        version = max(0, k - 2)
        assert batch["policy_version"].tolist() == [version] * len(batch)
        assert metrics["async/staleness/mean"] == k - 1 - version
        if version == 0:
            assert metrics["num_turns/mean"] > 1  # multi-turn (the big steps later cost the model its EOS)

        def log_probs(version: int) -> torch.Tensor:
            folder = eos_model if version == 0 else export_checkpoint(str(checkpoints / f"step_{version:08d}"),
                                                                      str(tmp_path / f"v{version}"))
            with torch.no_grad():
                return response_log_probs(load_causal_lm(folder).eval(), batch, batch.meta["temperature"])[0]

        mask = batch["response_mask"].bool()
        assert (log_probs(version) - batch["rollout_log_probs"]).abs()[mask].max() < 1e-4
        if k >= 3:  # and not the trainer's own weights: the lag is real
            assert (log_probs(k - 1) - batch["rollout_log_probs"]).abs()[mask].mean() > 1e-3
