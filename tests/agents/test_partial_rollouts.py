"""Partial rollouts (`AsyncRollout(partial_rollouts=True)`, rlhf.agents.partial): multi-turn conversations outlive
their batch and continue on newer weights. Every emitted token lies within the staleness bound of the step that
trains it (a hypothesis property over turn counts and weight-update timings), and through RLTrainer on the tiny
model a conversation that spans a weight update carries two versions, each token's log-prob that of the weights
that sampled it, and the loss's behaviour log-probs are those per-token ones."""

import threading

import fiddle as fdl
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhf.agents import AgentRollout, StepResult
from rlhf.agents.partial import PartialRollouts
from rlhf.data.prompts import PromptDataset
from rlhf.rollout.sampling import SamplingParams
from rlhf.trainers.async_rollout import AsyncRollout, versions_per_sample
from scripted import ScriptedPolicy
from test_trajectory import tokenizer


class TurnsEnvironment:
    """A conversation ends after the number of turns its row asks for (`extra_info["turns"]`): a long-tailed
    turn count when a few rows ask for many."""

    def reset(self, row):
        self.turns = int(row["extra_info"]["turns"])
        return list(row["raw_prompt"])

    def step(self, action):
        return StepResult([{"role": "user", "content": "Go on."}], done=action.turn >= self.turns)


def rows(turns):
    return [{"data_source": "calc", "prompt": [{"role": "user", "content": f"Q{i:02d}"}],
             "reward_model": {"ground_truth": "3"}, "extra_info": {"turns": t}} for i, t in enumerate(turns)]


# ------------------------------------------------------------------------------------------ the bound
@settings(max_examples=12, deadline=None)
@given(turns=st.lists(st.sampled_from([1, 1, 1, 2, 6]), min_size=24, max_size=24),
       max_staleness=st.integers(0, 3), publishes=st.lists(st.booleans(), min_size=80, max_size=80))
def test_every_emitted_token_is_within_the_staleness_bound(turns, max_staleness, publishes):
    """Production i (trained at version i-1) starts when version i-1-s is published; between its turns the trainer
    may publish up to version i-1 (drawn). Every sampled token of batch i is of a version in [i-1-s, i-1]; a
    row's `policy_version` is its oldest token's and `policy_version_last` its newest; every group is emitted
    once, dropped, or still in the pool; nothing was dropped that the bound allowed."""
    tok, g, n = tokenizer(), 2, 2
    data = PromptDataset(rows(turns), tok, raw_prompt=True)
    batches = iter([data.collate(range(k, k + g)) for k in range(0, 24, g)])
    policy = ScriptedPolicy(tok, {f"Q{i:02d}": ["ok"] * 6 for i in range(24)})
    agent = AgentRollout(environment=TurnsEnvironment, tokenizer=tok, max_turns=6, max_response_tokens=64)
    pool, clock, draws = PartialRollouts(agent), {"published": 0, "production": 0}, iter(publishes)

    def generate(prompts, sampling):
        if next(draws, False) and clock["published"] < clock["production"] - 1:
            clock["published"] += 1  # the trainer finished a step meanwhile
        out = policy.generate(prompts, sampling)
        out["policy_version"] = torch.full((len(out),), clock["published"])
        return out

    emitted, dropped = [], 0
    for i in range(1, 5):
        oldest = max(0, i - 1 - max_staleness)
        clock["production"], clock["published"] = i, max(clock["published"], oldest)
        pool.oldest_allowed = oldest
        batch, metrics = pool.rollout(generate, next(batches), SamplingParams(n=n, max_new_tokens=4),
                                      more_prompts=lambda: next(batches))
        versions = batch["token_policy_version"]
        sampled = versions[versions >= 0]
        assert oldest <= int(sampled.min()) and int(sampled.max()) <= i - 1
        for row in range(len(batch)):
            mine = versions[row][versions[row] >= 0]
            assert int(batch["policy_version"][row]) == int(mine.min())
            assert int(batch["policy_version_last"][row]) == int(mine.max())
        assert len(batch) == g * n and list(batch["uid"][::n]) == list(batch["uid"][1::n])  # whole groups
        emitted += list(batch["uid"][::n])
        dropped += int(metrics["async/partial_dropped"]) // n
        assert metrics["async/carried_groups"] == len(pool.groups)
        assert all(gr.oldest is None or gr.oldest >= oldest for gr in pool.groups)  # the pool holds no lost cause
    admitted = 24 - sum(1 for _ in batches) * g
    assert len(set(emitted)) == len(emitted)  # no group twice
    assert len(emitted) + dropped + len(pool.groups) == admitted
    if max_staleness == 3:  # batch 4 trains at version 3: no token of four batches is more than 3 behind
        assert dropped == 0
    pool.close()


@given(st.lists(st.lists(st.integers(-1, 5), min_size=1, max_size=12), min_size=1, max_size=6))
def test_versions_per_sample_counts_the_distinct_versions_of_the_sampled_tokens(rows_):
    width = max(len(r) for r in rows_)
    versions = torch.tensor([r + [-1] * (width - len(r)) for r in rows_])
    assert versions_per_sample(versions).tolist() == [len({v for v in r if v >= 0}) for r in rows_]


def test_a_resumed_pool_restarts_the_groups_its_checkpoint_held():
    """A checkpoint keeps the pool's prompts (`pending`, JSON); a resumed run admits them first and runs them from
    their start (an environment's state cannot be saved): each is emitted once, with all its turns."""
    import json

    tok, n = tokenizer(), 2
    data = PromptDataset(rows([3] + [1] * 11), tok, raw_prompt=True)
    policy = ScriptedPolicy(tok, {f"Q{i:02d}": ["ok"] * 6 for i in range(12)})
    agent = AgentRollout(environment=TurnsEnvironment, tokenizer=tok, max_turns=6, max_response_tokens=64)
    sampling = SamplingParams(n=n, max_new_tokens=4)
    pool = PartialRollouts(agent)
    more = iter([data.collate([2, 3])])
    batch, _ = pool.rollout(policy.generate, data.collate([0, 1]), sampling, more_prompts=lambda: next(more))
    question = lambda b: [p[0]["content"] for p in b["raw_prompt"][::n]]  # noqa: E731
    assert question(batch) == ["Q01", "Q02"]  # Q00 asks for 3 turns: still running after 2
    saved = json.loads(json.dumps(pool.pending(), default=str))  # what the checkpoint's partial_pool.json holds
    assert [s["record"]["raw_prompt"][0]["content"] for s in saved] == ["Q00", "Q03"]
    pool.close()

    resumed, emitted = PartialRollouts(agent), []
    resumed.restart(saved)
    for rows_ in ([6, 7], [4, 5], [8, 9], [10, 11]):
        out, _ = resumed.rollout(policy.generate, data.collate(rows_), sampling)
        emitted += [(q, e["agent"]["num_turns"]) for q, e in zip(question(out), out["extra_info"][::n])]
    assert emitted[0] == ("Q03", 1) and ("Q00", 3) in emitted  # restarted from its start: 3 turns, not 2 + 3
    assert len({q for q, _ in emitted}) == len(emitted)  # none twice
    resumed.close()


def test_partial_rollouts_refuse_what_they_cannot_continue():
    from rlhf.trainers.rollout_producer import SingleTurn

    with pytest.raises(ValueError, match="need RLTrainer\\(rollout=AgentRollout"):
        PartialRollouts(SingleTurn())
    with pytest.raises(ValueError, match="weights='newest' and on_stale='wait'"):
        AsyncRollout(rollout=None, weights="fixed_lag", partial_rollouts=True)


# ------------------------------------------------------------------------------ through RLTrainer
EMITTED = []  # batches the pool has emitted in this run
FIRST_TURN = threading.Event()  # a turn of the second batch was sampled (with version 0)
PUBLISHED = threading.Event()  # the trainer published version 1


class GatedEnvironment:
    """Three turns per conversation. In the second batch the first step waits until the trainer has published
    version 1 (and lets it publish only then): so that batch's first turns are version 0's and its later turns
    version 1's, whatever the timing."""

    def reset(self, row):
        return list(row["raw_prompt"])

    def step(self, action):
        if EMITTED and not PUBLISHED.is_set():
            FIRST_TURN.set()
            assert PUBLISHED.wait(120), "the trainer never published version 1"
        return StepResult([{"role": "user", "content": f"And {action.turn}+1?"}], done=action.turn == 3)


def agent_experiment(model: str, out, environment, *, rows: int, max_turns: int, max_response_tokens: int,
                     max_new_tokens: int, objective=None, lr: float = 1e-5, **stage) -> fdl.Config:
    """An RL experiment on `model` whose rollout is `environment`'s multi-turn loop, 2 answers per prompt, 2 prompts
    per step, in this process; asynchronous rollout is for the caller to add (`common.streaming`)."""
    from rlhf.algos import GRPO
    from rlhf.data.generators import arithmetic_rows
    from rlhf.models.loading import load_tokenizer
    from rlhf.rewards.arithmetic import digit_match_score
    from rlhf.rewards.manager import RewardManager
    from rlhf.runtime.experiment import Experiment
    from rlhf.runtime.local import LocalRuntime
    from rlhf.trainers.rl import RLTrainer
    from rlhf.workers.objectives import PolicyObjective
    from rlhf.workers.training import TrainingSetup
    from rlhf_configs.pieces import policy_group

    tok = fdl.Config(load_tokenizer, model)
    rl = fdl.Config(
        RLTrainer,
        policy=policy_group(model_path=model, objective=objective or fdl.Config(PolicyObjective),
                            optimizer=fdl.Partial(torch.optim.AdamW, lr=lr),
                            training=fdl.Config(TrainingSetup, micro_batch_size=8)),
        tokenizer=tok,
        train_data=fdl.Config(PromptDataset, rows=fdl.Config(arithmetic_rows, n=rows), tokenizer=tok, raw_prompt=True),
        reward=fdl.Config(RewardManager, scorers={"arithmetic": digit_match_score}),
        advantage=fdl.Config(GRPO),
        sampling=fdl.Config(SamplingParams, n=2, max_new_tokens=max_new_tokens),
        rollout=fdl.Config(AgentRollout, environment=environment, tokenizer=tok, max_turns=max_turns,
                           max_response_tokens=max_response_tokens),
        prompts_per_step=2, **stage,
    )
    return fdl.Config(Experiment, name="partial", stages={"rl": rl}, runtime=fdl.Config(LocalRuntime),
                      output_dir=str(out), run_name="run", progress=False)


def test_a_conversation_spanning_a_weight_update_keeps_each_tokens_version(eos_model, tmp_path, monkeypatch):
    from rlhf.models.loading import load_causal_lm
    from rlhf.trainers.export import export_checkpoint
    from rlhf.workers.objectives import PolicyObjective
    from rlhf.workers.policy import response_log_probs
    from helpers import run_capturing
    from rlhf_configs import common

    EMITTED.clear(), FIRST_TURN.clear(), PUBLISHED.clear()
    rollout, after_update = PartialRollouts.rollout, AsyncRollout.after_update

    def counted(self, *args, **kwargs):
        out = rollout(self, *args, **kwargs)
        EMITTED.append(len(out[0]))
        return out

    def publish_after_a_first_turn(self, step, timing):
        if step == 1:
            FIRST_TURN.wait(120)
        out = after_update(self, step, timing)
        if step == 1:
            PUBLISHED.set()
        return out

    monkeypatch.setattr(PartialRollouts, "rollout", counted)
    monkeypatch.setattr(AsyncRollout, "after_update", publish_after_a_first_turn)
    g = agent_experiment(eos_model, tmp_path / "out", GatedEnvironment, rows=16, max_turns=3, max_response_tokens=64,
                         max_new_tokens=8, objective=fdl.Config(PolicyObjective, entropy_coef=0.5), lr=3e-2,
                         total_steps=3, save_freq=1, keep_checkpoints=3)
    common.streaming(g, max_staleness=2, partial_rollouts=True)
    seen = run_capturing(monkeypatch, g)

    metrics, batch = seen[2]  # trained at version 1
    versions, mask = batch["token_policy_version"], batch["response_mask"].bool()
    assert set(versions[mask].tolist()) == {0, 1}, "the second batch's conversations continued on version 1"
    assert metrics["async/partial_samples"] >= 1 and metrics["async/versions_per_sample/max"] == 2
    assert batch["policy_version"].tolist() == [0] * len(batch) and metrics["async/staleness/max"] == 1

    checkpoints = tmp_path / "out" / "partial" / "run" / "rl" / "checkpoints"
    with torch.no_grad():
        v0 = response_log_probs(load_causal_lm(eos_model).eval(), batch, batch.meta["temperature"])[0]
        v1_folder = export_checkpoint(str(checkpoints / "step_00000001"), str(tmp_path / "v1"))
        v1 = response_log_probs(load_causal_lm(v1_folder).eval(), batch, batch.meta["temperature"])[0]
    behaviour = batch["rollout_log_probs"]
    for version, under in ((0, v0), (1, v1)):  # token exactness: each token's log-prob is its own version's
        mine = mask & (versions == version)
        assert (behaviour - under).abs()[mine].max() < 1e-4, version
    assert (behaviour - v0).abs()[mask & (versions == 1)].mean() > 1e-3  # and version 1 really differs
    # bypass: the PPO ratio is against each token's own behaviour log-prob (ppo_kl: the token mean of old - new)
    assert torch.equal(batch["old_log_probs"], behaviour)
    assert metrics["actor/ppo_kl"] == pytest.approx(float((behaviour - v1)[mask].mean()), abs=1e-5)
    assert torch.isfinite(torch.tensor(metrics["actor/pg_loss"]))


class BrokenEnvironment:
    """Every reset fails: a batch in which nothing is sampled."""

    def reset(self, row):
        raise RuntimeError("no sandbox today")

    def step(self, action):
        raise AssertionError("never reached")


@pytest.mark.parametrize("partial", [True, False], ids=["partial", "streaming"])
def test_an_asynchronous_batch_in_which_every_reset_failed_is_trained_and_counted(eos_model, tmp_path, partial,
                                                                                  monkeypatch):
    """It carried no `policy_version` (no turn was sampled) and ended the run with a KeyError in the producer
    thread; its rows hold no stale token, so they take the loaded version, and the failures are counted."""
    from helpers import run_capturing
    from rlhf_configs import common

    g = agent_experiment(eos_model, tmp_path / "out", BrokenEnvironment, rows=8, max_turns=2, max_response_tokens=16,
                         max_new_tokens=4, total_steps=2, records=None)
    common.streaming(g, max_staleness=1, partial_rollouts=partial)
    seen = run_capturing(monkeypatch, g)
    assert len(seen) == 2
    for metrics, batch in seen.values():
        assert metrics["agent/env_errors"] == 4 and batch["response_mask"].sum() == 0
        assert metrics["async/staleness/max"] <= 1
