"""Multi-turn rollouts on vLLM (its CPU build): the engine serves each turn from token ids like any
rollout, so a greedy conversation is token for token the transformers engine's; in the policy worker it
stays awake between turns, and follows the actor's weights after an update."""

import functools

import pytest
import torch

from rlhf.agents import AgentRollout
from rlhf.algos import PPOClipLoss
from rlhf.models.loading import load_tokenizer
from rlhf.rollout import HFEngine, SamplingParams
from rlhf.rollout.vllm_engine import VLLMEngine
from rlhf.workers.objectives import PolicyObjective
from rlhf.workers.policy import PolicyWorker
from rlhf.workers.training import TrainingSetup
from test_agent_rollout import ContinueEnvironment, prompts

pytestmark = pytest.mark.vllm

QUESTIONS = ["What is 12+30?", "What is 7+8?", "What is 40+41?"]
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=10)
ENGINE = functools.partial(VLLMEngine, dtype="float32", max_model_len=256, max_num_seqs=64)


def agent(tok):
    return AgentRollout(environment=ContinueEnvironment, tokenizer=tok, max_turns=3, max_response_tokens=64)


def test_greedy_conversations_on_vllm_equal_the_transformers_engine(vllm_eos_model):
    tok = load_tokenizer(vllm_eos_model)
    ours, metrics = agent(tok).rollout(HFEngine(vllm_eos_model).generate, prompts(tok, QUESTIONS), GREEDY)
    theirs, _ = agent(tok).rollout(ENGINE(vllm_eos_model).generate, prompts(tok, QUESTIONS), GREEDY)
    assert metrics["num_turns/mean"] > 1
    for key in ("input_ids", "attention_mask", "response_mask"):
        assert torch.equal(ours[key], theirs[key]), key
    assert torch.allclose(ours["rollout_log_probs"], theirs["rollout_log_probs"], atol=1e-4)


def test_policy_worker_on_vllm_keeps_the_engine_awake_between_turns_and_syncs_after_updates(vllm_eos_model):
    tok = load_tokenizer(vllm_eos_model)
    worker = PolicyWorker(vllm_eos_model, objective=PolicyObjective(policy_loss=PPOClipLoss()),
                          optimizer=functools.partial(torch.optim.SGD, lr=0.05), engine=ENGINE,
                          training=TrainingSetup(micro_batch_size=16, grad_clip=None))
    syncs = []
    update_weights = worker.engine.update_weights
    worker.engine.update_weights = lambda weights: (syncs.append(1), update_weights(weights))
    actor = HFEngine.sharing(worker.trainer.unwrapped(), worker.tokenizer)  # what the actor itself would say

    def rollout(sampling):
        before = len(syncs)
        out = agent(tok)(worker, prompts(tok, QUESTIONS), sampling)
        return out, len(syncs) - before

    (first, metrics), synced = rollout(GREEDY)
    assert metrics["num_turns/max"] > 1 and synced == 0  # a fresh engine holds the actor's weights
    (batch, _), synced = rollout(SamplingParams(n=2, max_new_tokens=10))
    assert synced == 1  # the engine slept after the last rollout: its weights come back once, for all turns
    batch["advantages"] = torch.linspace(-1, 1, len(batch))[:, None] * batch["response_mask"]
    assert worker.update(batch)["rollout_corr/log_prob_abs_diff_max"] < 1e-4
    (after, metrics), synced = rollout(GREEDY)
    assert metrics["num_turns/max"] > 1 and synced == 1  # once per rollout, not once per turn
    expected, _ = agent(tok).rollout(actor.generate, prompts(tok, QUESTIONS), GREEDY)
    assert torch.equal(after["input_ids"], expected["input_ids"])  # vLLM follows the updated actor
    assert torch.allclose(after["rollout_log_probs"], expected["rollout_log_probs"], atol=1e-4)
    moved = after["rollout_log_probs"].shape != first["rollout_log_probs"].shape or not torch.allclose(
        after["rollout_log_probs"], first["rollout_log_probs"], atol=1e-3)
    assert moved  # the update changed what the engine samples
