"""Turns sampled in chunks (`AgentRollout(turn_chunk_tokens=...)`): a long turn is several generate calls, so a
weight update can land inside it (partial rollouts). Chunking changes nothing a trainer reads (ids, masks,
log-probs, messages, turn spans, how each conversation ended), and with partial rollouts the tokens of one turn keep
the version of the weights that sampled each chunk."""

import pytest
import torch

from rlhf.agents import AgentRollout, StepResult
from rlhf.agents.batch import trajectory_batch
from rlhf.agents.partial import PartialRollouts
from rlhf.agents.trajectory import Trajectory
from rlhf.batch import Batch
from rlhf.data.prompts import PromptDataset
from rlhf.rollout.sampling import SamplingParams
from scripted import ScriptedPolicy
from test_trajectory import tokenizer

LONG = "The sum of one and two is three, as anyone can check by counting on their fingers."
SCRIPTS = {  # per question, its assistant turns
    "Q0": [LONG, "Three."],
    "Q1": ["Short.", LONG, "Done."],
    "Q2": [LONG + " " + LONG],  # longer than the turn budget below: cut ("length")
}


class TwoTurns:
    """Ends a conversation after the number of assistant turns its script has (or 3)."""

    def reset(self, row):
        self.left = len(SCRIPTS[row["raw_prompt"][0]["content"]])
        return list(row["raw_prompt"])

    def step(self, action):
        self.left -= 1
        return StepResult([{"role": "user", "content": "Go on."}], reward=1.0 if self.left == 0 else None,
                          done=self.left <= 0)


def prompts(tok, questions=tuple(SCRIPTS)):
    rows = [{"data_source": "calc", "prompt": [{"role": "user", "content": q}], "reward_model": {"ground_truth": "3"},
             "extra_info": {}} for q in questions]
    return PromptDataset(rows, tok, raw_prompt=True).collate(range(len(rows)))


def run(chunk, max_new_tokens=100, max_response_tokens=400, n=1):
    # n=1: the scripted log-probs count each question's sampled tokens, one conversation per question
    tok = tokenizer()
    policy = ScriptedPolicy(tok, SCRIPTS)
    agent = AgentRollout(environment=TwoTurns, tokenizer=tok, max_turns=3, max_response_tokens=max_response_tokens,
                         turn_chunk_tokens=chunk)
    batch, metrics = agent.rollout(policy.generate, prompts(tok), SamplingParams(n=n, max_new_tokens=max_new_tokens))
    return batch, metrics, policy.calls


@pytest.mark.parametrize("chunk", [1, 5, 7, 100])
@pytest.mark.parametrize("max_response_tokens", [400, 120])  # 120: the token budget ends a conversation mid-turn
def test_chunked_turns_give_the_batch_one_call_per_turn_gives(chunk, max_response_tokens):
    whole, whole_metrics, whole_calls = run(None, max_response_tokens=max_response_tokens)
    chunked, metrics, calls = run(chunk, max_response_tokens=max_response_tokens)
    for key in ("prompts", "responses", "response_mask", "rollout_log_probs", "attention_mask"):
        assert torch.equal(whole[key], chunked[key]), key
    assert list(chunked["response_text"]) == list(whole["response_text"])
    assert [e["agent"] for e in chunked["extra_info"]] == [e["agent"] for e in whole["extra_info"]]
    untimed = {k: v for k, v in whole_metrics.items() if not k.startswith("timing_s/")}
    assert {k: metrics[k] for k in untimed} == untimed and "response_length/turn_1/mean" in untimed
    assert calls > whole_calls if chunk < 100 else calls == whole_calls


def test_the_cut_and_the_budget_end_conversations_as_without_chunks():
    batch, metrics, _ = run(5)
    finish = [e["agent"]["finish_reason"] for e in batch["extra_info"]]
    assert finish == ["done", "done", "length"]  # Q2's one turn (165 tokens) is cut at 100
    batch, _, _ = run(5, max_response_tokens=120)
    assert "max_tokens" in [e["agent"]["finish_reason"] for e in batch["extra_info"]]


def test_a_turn_spanning_a_weight_update_keeps_each_chunks_version():
    """Partial rollouts: the producer publishes a new version between two chunks of one turn; that turn's tokens
    carry both versions, the row's policy_version is its oldest token's and policy_version_last its newest."""
    tok = tokenizer()
    policy = ScriptedPolicy(tok, SCRIPTS)
    agent = AgentRollout(environment=TwoTurns, tokenizer=tok, max_turns=3, max_response_tokens=400,
                         turn_chunk_tokens=50)
    version = {"now": 0, "calls": 0}

    def generate(batch, sampling):
        version["calls"] += 1
        version["now"] = 0 if version["calls"] <= 1 else 1  # an update after the first chunk
        out = policy.generate(batch, sampling)
        out["policy_version"] = torch.full((len(out),), version["now"])
        return out

    pool = PartialRollouts(agent)
    batch, metrics = pool.rollout(generate, prompts(tok, ["Q0"]), SamplingParams(n=1, max_new_tokens=100))
    versions = batch["token_policy_version"]
    first_turn = versions[0][:83].tolist()  # LONG and its end-of-turn token: one turn, two chunks
    assert first_turn[:50] == [0] * 50 and first_turn[50:] == [1] * 33  # one turn, two versions
    assert batch["policy_version"].tolist() == [0] and batch["policy_version_last"].tolist() == [1]
    pool.close()


def test_continuations_survive_a_record_round_trip():
    t = Trajectory([1, 2], [], 10, response_ids=[3, 4, 5], loss_mask=[1, 1, 1], log_probs=[-0.1, -0.2, -0.3],
                   turns=[(0, 3)], turn_versions=[4], continuations=[(2, 5)])
    back = Trajectory.from_dict(t.to_dict())
    assert back.continuations == [(2, 5)] and back.versions == [4, 5]
    batch = trajectory_batch([back], Batch.from_rows([{"uid": "a"}], {}), 0, 1.0, 10)
    assert batch["token_policy_version"][0, :3].tolist() == [4, 4, 5]


def test_continue_sampled_refuses_a_turn_that_is_not_paused():
    t = Trajectory([1], [], 10)
    with pytest.raises(ValueError, match="not paused"):
        t.continue_sampled(None, [2], [-0.1])


def test_with_the_real_engine_chunks_are_token_exact(eos_model):
    """The transformers engine continuing a paused turn from its ids: greedy, chunks of 1 token give the tokens one call
    per turn gives; sampled, every chunk's log-probs equal the trainer's recompute over the whole conversation."""
    from rlhf.models.loading import load_tokenizer
    from rlhf.rollout.hf_engine import HFEngine
    from rlhf.workers.policy import PolicyWorker

    class Continue:
        def reset(self, row):
            return list(row["raw_prompt"])

        def step(self, action):
            return StepResult([{"role": "user", "content": f"And {action.turn}+1?"}], done=action.turn == 3)

    tok, engine = load_tokenizer(eos_model), HFEngine(eos_model)
    questions = [{"data_source": "calc", "prompt": [{"role": "user", "content": q}], "reward_model": {"ground_truth": "3"},
                  "extra_info": {}} for q in ("What is 12+30?", "What is 7+8?")]
    rows = PromptDataset(questions, tok, raw_prompt=True).collate(range(2))

    calls = []

    def rollout(chunk, sampling):
        agent = AgentRollout(environment=Continue, tokenizer=tok, max_turns=3, max_response_tokens=96,
                             turn_chunk_tokens=chunk)
        torch.manual_seed(0)
        calls.append(0)

        def generate(batch, turn):
            calls[-1] += 1
            return engine.generate(batch, turn)
        return agent.rollout(generate, rows, sampling)

    greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=10)
    (whole, _), (chunked, metrics) = rollout(None, greedy), rollout(1, greedy)
    assert metrics["num_turns/mean"] > 1 and calls[1] > calls[0]  # turns of more than 1 token were paused
    for key in ("responses", "response_mask", "attention_mask"):
        assert torch.equal(whole[key], chunked[key]), key
    assert (whole["rollout_log_probs"] - chunked["rollout_log_probs"]).abs().max() < 1e-4

    sampled, _ = rollout(2, SamplingParams(n=4, temperature=1.0, max_new_tokens=10))
    assert calls[2] > calls[0]
    mask = sampled["response_mask"].bool()
    old = PolicyWorker(eos_model).compute_log_probs(sampled)["old_log_probs"]
    assert (old - sampled["rollout_log_probs"]).abs()[mask].max() < 1e-4
