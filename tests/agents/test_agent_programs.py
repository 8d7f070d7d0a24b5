"""Black-box agent programs in the RL loop (rlhf.agent_programs): an `async def run(task, client)` written with the
real `openai` client runs for tasks x n attempts on the recording gateway over the live `generate`. A crashing,
hanging or misbehaving agent costs its own attempt; forks and attempts without a completion become rows as
documented; the recorded ids are token-exact (one render of the agent's conversation, the trainer's log-probs);
the trainer's sampling wins over the agent's; RLTrainer trains through it, synchronously and one step off."""

import asyncio
import threading
import time

import fiddle as fdl
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from program_agents import CONVERSATIONS, Moody, answer_once, two_turns
from rlhf.agent_programs import AgentProgramRollout, attempt_function, outcome
from rlhf.algos import GRPO, PPOClipLoss
from rlhf.agents.environment import environment_reward
from rlhf.batch import Batch
from rlhf.data.generators import arithmetic_rows
from rlhf.data.prompts import PromptDataset
from rlhf.models.loading import load_causal_lm, load_tokenizer
from rlhf.rewards.manager import RewardManager
from rlhf.rollout.engine import rollout_batch
from rlhf.rollout.hf_engine import HFEngine
from rlhf.rollout.sampling import SamplingParams
from rlhf.runtime.experiment import Experiment
from rlhf.runtime.local import LocalRuntime
from rlhf.trainers.async_rollout import RolloutPipeline
from rlhf.trainers.export import export_checkpoint
from rlhf.trainers.records import RolloutRecorder, read_records
from rlhf.trainers.rl import RLTrainer
from rlhf.workers.objectives import PolicyObjective
from rlhf.workers.policy import PolicyWorker, response_log_probs
from rlhf.workers.training import TrainingSetup
from rlhf_configs import common
from rlhf_configs.pieces import policy_group
from helpers import run_capturing, tiny_model_path
from scripted import ScriptedPolicy
from test_trajectory import tokenizer

MOODS = ["ok", "raises", "hangs", "async hangs", "bad return", "nan", "exits", "forks", "no completion"]


def moody_prompts(tok) -> Batch:
    rows = [{"data_source": "calc", "prompt": [{"role": "user", "content": f"What is 1+2? ({mood})"}],
             "reward_model": {"ground_truth": "3"}, "extra_info": {"mood": mood}} for mood in MOODS]
    return PromptDataset(rows, tok, raw_prompt=True).collate(range(len(rows)))


def scripted(tok) -> ScriptedPolicy:
    scripts = {f"({mood})": ["3", "You're welcome."] for mood in MOODS}
    return ScriptedPolicy(tok, {**scripts, "And 2+2?": ["4"]})


def test_a_failing_agent_costs_only_its_attempt_and_forks_are_rows_of_their_own():
    tok = tokenizer()
    # the hanging attempts count as running: each batch waits batch_wait_ms for them, so keep it short here
    rollout = AgentProgramRollout(Moody, tok, attempt_timeout_s=1.0, batch_wait_ms=50.0)
    started = time.perf_counter()
    batch, metrics = rollout.rollout(scripted(tok).generate, moody_prompts(tok), SamplingParams(n=2, max_new_tokens=16))
    assert time.perf_counter() - started < 8  # the hangs cost their timeout, at the same time
    rows: dict[str, list[dict]] = {}
    for i, (extra, mask) in enumerate(zip(batch["extra_info"], batch["response_mask"])):
        rows.setdefault(extra["mood"], []).append({**extra["agent"], "trained": int(mask.sum())})
    # a fork: the independent second question is a trajectory of its own, the first question's continuation
    # continues the first (the gateway follows the agent's messages): two trajectories per attempt
    assert [len(rows[m]) for m in MOODS] == [2, 2, 2, 2, 2, 2, 2, 4, 2]
    for row in rows["ok"]:  # both turns trained: "3" + EOS and "You're welcome." + EOS
        assert row == {"reward": 1.0, "num_turns": 2, "finish_reason": "done", "trained": 2 + 16, **row}
    for mood in ("raises", "hangs", "async hangs", "bad return", "nan", "exits"):
        for row in rows[mood]:
            assert row["finish_reason"] == "error" and row["trained"] == 0 and row["reward"] == 0.0, mood
    assert rows["raises"][0]["agent_error"] == "RuntimeError: the agent broke"
    assert rows["hangs"][0]["agent_error"] == rows["async hangs"][0]["agent_error"] == "no result within 1 s"
    assert "returned reward is 'yes', not a number" in rows["bad return"][0]["agent_error"]
    assert "nan, not a finite number" in rows["nan"][0]["agent_error"]
    assert rows["exits"][0]["agent_error"] == "SystemExit: 3"
    forks = rows["forks"]
    assert sorted(r["num_turns"] for r in forks) == [1, 1, 2, 2] and all(r["reward"] == 1.0 for r in forks)
    assert all(r["trained"] == 0 and r["reward"] == 0.5 and r["num_turns"] == 0 for r in rows["no completion"])
    assert batch["uid"].tolist() == [u for u, m in zip(moody_prompts(tok)["uid"], MOODS)
                                     for _ in range(2 * (2 if m == "forks" else 1))]  # each task's rows adjacent
    assert metrics["agent/attempts"] == 18 and metrics["agent/trajectories"] == 20
    assert metrics["agent/errors/RuntimeError"] == metrics["agent/errors/SystemExit"] == 2
    assert metrics["agent/errors/bad_return"] == 4 and metrics["agent/errors/total"] == 8
    assert metrics["agent/timeouts"] == 4 and metrics["agent/no_completions"] == 2 and metrics["agent/forked"] == 2
    assert metrics["num_turns/max"] == 2 and metrics["response_length/turn_2/mean"] > 0


def test_evaluation_keeps_one_row_per_attempt():
    tok = tokenizer()

    class Policy:  # the policy group's two methods the evaluator's entry calls
        slept = 0

        def __init__(self):
            self.engine = scripted(tok)

        def generate(self, batch, sampling, keep_awake=False):
            assert keep_awake
            return self.engine.generate(batch, sampling)

        def sleep_engine(self):
            Policy.slept += 1

    prompts = moody_prompts(tok)
    batch, _ = AgentProgramRollout(Moody, tok, attempt_timeout_s=1.0, batch_wait_ms=50.0)(Policy(), prompts,
                                                                                         SamplingParams(n=2))
    assert batch["uid"].tolist() == [u for u in prompts["uid"] for _ in range(2)] and Policy.slept == 1
    fork = MOODS.index("forks") * 2
    last = batch["extra_info"][fork]["agent"]  # the attempt's last trajectory: its continued first question
    assert last["num_turns"] == 2 and last["reward"] == 1.0


def test_an_agent_program_must_be_async_and_return_a_reward():
    def sync_agent(task, client):
        return 1.0

    with pytest.raises(TypeError, match="expected `async def run"):
        attempt_function(sync_agent)
    with pytest.raises(TypeError, match="a class needs `async def run"):
        attempt_function(type("NoRun", (), {}))
    assert attempt_function(answer_once)() is answer_once
    assert outcome(1) .reward == 1.0 and outcome(None).reward is None
    assert outcome({"reward": 0.5, "turns": 3}) == outcome({"turns": 3, "reward": 0.5})
    assert outcome({"turns": 3}).reward is None and outcome({"turns": 3}).info == {"turns": 3.0}
    for bad, message in ((float("inf"), "inf, not a finite"), ("1", "not a number"), ({"reward": [1]}, "not a number"),
                         ({"reward": 1, "note": "fine"}, "returned\\['note'\\]")):
        with pytest.raises(ValueError, match=message):
            outcome(bad)


# ------------------------------------------------------------------------------------------ the real engine
def arithmetic_prompts(tok, n: int, raw: bool = True) -> Batch:
    return PromptDataset(arithmetic_rows(n, seed=3), tok, raw_prompt=raw).collate(range(n))


@pytest.mark.parametrize("transport", ["in_process", "loopback"])
def test_trajectories_are_token_exact_and_the_trainer_decides_sampling(eos_model, transport):
    """The agent asks greedily with a seed, max_tokens=5000 and another model's name: the gateway samples as the
    trainer says instead (temperature 1, its max_new_tokens). Every trajectory is one render of the conversation the
    agent holds (ChatML appends), and the trainer's log-probs over it equal the recorded ones."""
    tok = load_tokenizer(eos_model)
    engine = HFEngine(eos_model)
    prompts = arithmetic_prompts(tok, 4)
    rollout = AgentProgramRollout(two_turns, tok, transport=transport)
    torch.manual_seed(0)
    CONVERSATIONS.clear()
    batch, metrics = rollout.rollout(engine.generate, prompts, SamplingParams(n=2, temperature=1.0, max_new_tokens=8))
    assert metrics["agent/errors/total"] == 0 and metrics["num_turns/min"] == 2
    assert metrics["agent/generate_calls"] <= 4  # batched: 2 when each turn of the 8 attempts is one call (16 unbatched)
    assert metrics["info/length/mean"] == 5  # the question, two replies, a tool result, a follow-up
    assert batch.meta["temperature"] == 1.0
    for turn in (1, 2):
        assert metrics[f"response_length/turn_{turn}/mean"] <= 8
    held = {}  # the conversations the agents hold, by task
    for uid, messages in CONVERSATIONS:
        held.setdefault(uid, []).append(tok.apply_chat_template(messages, tokenize=False))
    for i, uid in enumerate(batch["uid"]):
        text = tok.decode(batch["input_ids"][i][batch["attention_mask"][i].bool()].tolist())
        cut = not text.endswith("<|im_end|>")  # the last reply hit max_new_tokens: the template closes it itself
        assert text + ("<|im_end|>\n" if cut else "\n") in held[uid]  # one render of a conversation held
    worker = PolicyWorker(eos_model, objective=PolicyObjective(policy_loss=PPOClipLoss()))
    old = worker.compute_log_probs(batch)["old_log_probs"]
    mask = batch["response_mask"].bool()
    assert mask.sum(dim=1).min() > 0
    assert (old - batch["rollout_log_probs"]).abs()[mask].max() < 1e-4


def test_the_same_greedy_agent_gives_the_same_ids_through_either_transport(eos_model):
    tok = load_tokenizer(eos_model)
    engine = HFEngine(eos_model)
    prompts = arithmetic_prompts(tok, 3)
    greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=8)
    ids = {t: AgentProgramRollout(two_turns, tok, transport=t).rollout(engine.generate, prompts, greedy)[0]["input_ids"]
           for t in ("in_process", "loopback")}
    assert torch.equal(ids["in_process"], ids["loopback"])


# --------------------------------------------------------------------------------------------- the trainer
def graph(out, steps=3, **trainer) -> fdl.Config[Experiment]:
    model = tiny_model_path()
    tok = fdl.Config(load_tokenizer, model)
    stage = fdl.Config(
        RLTrainer,
        policy=policy_group(model_path=model, objective=fdl.Config(PolicyObjective, policy_loss=fdl.Config(PPOClipLoss),
                                                                   entropy_coef=0.5),
                            optimizer=fdl.Partial(torch.optim.AdamW, lr=3e-2),
                            training=fdl.Config(TrainingSetup, micro_batch_size=8)),
        tokenizer=tok,
        train_data=fdl.Config(PromptDataset, rows=fdl.Config(arithmetic_rows, n=16), tokenizer=tok, raw_prompt=True),
        reward=fdl.Config(RewardManager, scorers={"arithmetic": environment_reward}),  # the agent's return
        advantage=fdl.Config(GRPO),
        sampling=fdl.Config(SamplingParams, n=4, max_new_tokens=6),
        rollout=fdl.Config(AgentProgramRollout, agent=answer_once, tokenizer=tok),
        prompts_per_step=4,
        total_steps=steps,
        save_freq=1,
        keep_checkpoints=steps,
        records=fdl.Partial(RolloutRecorder),
        **trainer,
    )
    return fdl.Config(Experiment, name="agent_program", stages={"rl": stage}, runtime=fdl.Config(LocalRuntime),
                      output_dir=str(out), run_name="run", progress=False)


def test_rl_trainer_trains_on_an_agent_programs_attempts(tmp_path, monkeypatch, capsys):
    from rlhf.cli.rollouts import rollouts_main

    seen = run_capturing(monkeypatch, graph(tmp_path / "out", steps=2))
    for step, (metrics, batch) in seen.items():
        assert metrics["agent/attempts"] == 16 and len(batch) == 16 and metrics["agent/errors/total"] == 0
        rewards = torch.tensor([e["agent"]["reward"] for e in batch["extra_info"]])
        assert torch.equal(batch["token_level_scores"].sum(dim=1), rewards)  # the agent's return is the score
        assert metrics["critic/score/mean"] == pytest.approx(float(rewards.mean()))
        assert batch["policy_version"].tolist() == [step - 1] * 16
    stage = tmp_path / "out" / "agent_program" / "run" / "rl"
    records = read_records(stage)
    assert {r["step"] for r in records} == {1, 2} and all(r["agent"]["finish_reason"] in ("done", "length")
                                                          for r in records)
    assert rollouts_main(["show", str(stage), "--step", "2"]) in (0, None)
    assert "best  score" in capsys.readouterr().out  # one completion per attempt: shown as a plain response


def version_weights(out, tmp_path, version: int) -> str:
    if version == 0:
        return tiny_model_path()
    ckpt = out / "agent_program" / "run" / "rl" / "checkpoints" / f"step_{version:08d}"
    return export_checkpoint(str(ckpt), str(tmp_path / f"v{version}"))


def test_one_step_off_trains_each_trajectory_on_its_behaviour_log_probs(tmp_path, monkeypatch):
    """`fiddler:one_step_off` with an agent program: batch k's attempts ran on version max(0, k-2), each
    trajectory says so (first and last version), and every sampled token's log-prob is that version's."""
    g = graph(tmp_path / "out", steps=4)
    common.one_step_off(g)
    seen = run_capturing(monkeypatch, g)
    for k, (metrics, batch) in seen.items():
        behaviour = max(0, k - 2)
        assert batch["policy_version"].tolist() == batch["policy_version_last"].tolist() == [behaviour] * len(batch)
        assert metrics["async/staleness/max"] == k - 1 - behaviour and metrics["agent/attempts"] == 16
        model = load_causal_lm(version_weights(tmp_path / "out", tmp_path, behaviour)).eval()
        with torch.no_grad():
            expected = response_log_probs(model, batch, batch.meta["temperature"])[0]
        mask = batch["response_mask"].bool()
        torch.testing.assert_close(batch["rollout_log_probs"][mask], expected[mask], atol=2e-5, rtol=0)
        assert torch.equal(batch["old_log_probs"], batch["rollout_log_probs"])  # bypass: pi_behaviour is pi_old


# ------------------------------------------------------------------------------ staleness, per trajectory
class VersionedEngine:
    """A rollout side whose weights are a version number: each sampled token's log-prob is -(version+1)/100, and
    every row carries `policy_version`, as the rollout group's generate does."""

    def __init__(self, tok):
        self.tok, self.version = tok, None

    def load(self, version: int) -> None:
        self.version = version

    def generate(self, prompts: Batch, sampling: SamplingParams) -> Batch:
        n = len(prompts)
        responses = torch.tensor([[self.tok.encode("7")[0], self.tok.eos_token_id]] * n)
        out = rollout_batch(prompts, responses, torch.full((n, 2), -(self.version + 1) / 100), sampling,
                            [self.tok.eos_token_id], self.tok.pad_token_id)
        out["policy_version"] = torch.full((n,), self.version, dtype=torch.int64)
        return out


class Dawdler:
    """Sleeps a drawn time before each of its requests (a slow tool), then asks again."""

    delays: list[float] = [0.0]

    async def run(self, task, client):
        messages = list(task["prompt"])
        for turn in range(2):
            await asyncio.sleep(self.delays[(len(messages) + turn) % len(self.delays)])
            reply = await client.chat.completions.create(model="m", messages=messages)
            messages += [{"role": "assistant", "content": reply.choices[0].message.content},
                         {"role": "user", "content": "Go on."}]
        return 1.0


@settings(max_examples=8, deadline=None)
@given(delays=st.lists(st.floats(0.0, 0.02), min_size=1, max_size=4), updates=st.lists(st.floats(0.0, 0.03),
       min_size=1, max_size=3), max_staleness=st.integers(0, 2), weights=st.sampled_from(["newest", "fixed_lag"]))
def test_every_trajectory_is_within_the_staleness_bound_with_its_behaviour_log_probs(delays, updates, max_staleness,
                                                                                      weights):
    """Agent-program batches through the asynchronous pipeline, whatever the agents' and the trainer's timings:
    every trajectory's first and last versions are within `max_staleness` of the step that trains it, and each
    sampled token's log-prob is the one its version gave (the correction's behaviour log-prob)."""
    tok = tokenizer()
    Dawdler.delays = delays
    side = VersionedEngine(tok)
    rollout = AgentProgramRollout(Dawdler, tok, batch_wait_ms=5.0)
    prompts = PromptDataset(arithmetic_rows(3, seed=1), tok, raw_prompt=True).collate(range(3))
    lock = threading.Lock()

    def produce(index: int, version: int):
        with lock:
            return rollout.rollout(side.generate, prompts, SamplingParams(n=2, max_new_tokens=4))

    steps = 4
    pipeline = RolloutPipeline(produce, side.load, max_staleness=max_staleness, weights=weights, last_index=steps)
    pipeline.publish(0, lambda version, keep_from: None)
    pipeline.start()
    try:
        for step in range(1, steps + 1):
            item, _ = pipeline.take(step)
            batch = item.batch
            first, last = batch["policy_version"], batch["policy_version_last"]
            assert ((step - 1 - first) <= max_staleness).all() and (last <= step - 1).all() and (first <= last).all()
            mask = batch["response_mask"].bool()
            token_versions = (-batch["rollout_log_probs"] * 100 - 1).round().long()
            for row in range(len(batch)):
                versions = token_versions[row][mask[row]]
                assert ((versions >= first[row]) & (versions <= last[row])).all()
            assert len(batch) == 6 and mask.sum(dim=1).min() == 4  # two turns of "7" + EOS each
            time.sleep(updates[step % len(updates)])
            pipeline.publish(step, lambda version, keep_from: None)
    finally:
        pipeline.close()



def test_a_broken_engine_fails_the_step_instead_of_every_attempt():
    tok = tokenizer()

    def broken(prompts, sampling):
        raise RuntimeError("CUDA error: an illegal memory access")

    with pytest.raises(RuntimeError, match="illegal memory access") as err:
        AgentProgramRollout(answer_once, tok).rollout(broken, arithmetic_prompts(tok, 2), SamplingParams(n=2))
    assert any("serving agent attempts" in note for note in err.value.__notes__)
