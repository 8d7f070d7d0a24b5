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
                          optimizer=functools.partial(torch.optim.SGD, lr=2.0), engine=ENGINE,
                          training=TrainingSetup(micro_batch_size=16, grad_clip=None))
    syncs = []
    update_weights = worker.engine.update_weights
    worker.engine.update_weights = lambda weights: (syncs.append(1), update_weights(weights))
    actor = HFEngine.sharing(worker.trainer.unwrapped(), worker.tokenizer)  # what the actor itself would say
    for step in range(2):
        before = len(syncs)
        batch, metrics = agent(tok)(worker, prompts(tok, QUESTIONS), SamplingParams(n=2, max_new_tokens=10))
        assert metrics["num_turns/max"] > 1
        assert len(syncs) - before == (1 if step else 0)  # once per rollout (after an update), not once per turn
        expected, _ = agent(tok).rollout(actor.generate, prompts(tok, QUESTIONS), GREEDY)
        greedy, _ = agent(tok)(worker, prompts(tok, QUESTIONS), GREEDY)  # synced again: the last rollout slept
        assert torch.equal(greedy["input_ids"], expected["input_ids"])  # vLLM follows the updated actor
        batch["advantages"] = torch.linspace(-1, 1, len(batch))[:, None] * batch["response_mask"]
        out = worker.update(batch)
        assert out["rollout_corr/log_prob_abs_diff_max"] < 1e-4
