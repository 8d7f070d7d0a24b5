"""Multi-turn rollouts from a policy group of 2 FSDP2 ranks (gloo, through Ray): every turn is one sharded
`generate`, so both ranks run the same calls and agree when each conversation ends (nothing waits in a
collective), the engine stays awake between turns, and the trajectories equal one rank's."""

import fiddle as fdl
import pytest
import torch

from rlhf.agents import AgentRollout
from rlhf.algos import KLLoss, PPOClipLoss, kl_k3
from rlhf.models.loading import load_tokenizer
from rlhf.rollout.sampling import SamplingParams
from rlhf.runtime.local import LocalRuntime
from rlhf.runtime.plan import compile_graph
from rlhf.runtime.ray_runtime import RayRuntime
from rlhf.workers.objectives import PolicyObjective
from rlhf.workers.training import TrainingSetup
from rlhf_configs.pieces import policy_group
from rlhf.agents import StepResult
from test_agent_rollout import prompts


class RaggedEnvironment:
    """Conversations end after 1, 2 or 3 turns, by question: later turns have an odd number of live rows."""

    def reset(self, row):
        question = row["raw_prompt"][0]["content"]
        self.last = 1 + sum(map(int, filter(str.isdigit, question))) % 3
        return list(row["raw_prompt"])

    def step(self, action):
        return StepResult([{"role": "user", "content": f"And {action.turn}+1?"}], done=action.turn == self.last)


def plan(model: str, num_workers: int):
    objective = fdl.Config(PolicyObjective, policy_loss=fdl.Config(PPOClipLoss),
                           kl_loss=fdl.Config(KLLoss, estimator=kl_k3, coef=0.01))
    return compile_graph(policy_group(
        num_workers=num_workers, model_path=model, ref_model_path=model, objective=objective,
        optimizer=fdl.Partial(torch.optim.SGD, lr=0.1), training=fdl.Config(TrainingSetup, strategy="fsdp")))


@pytest.mark.slow
@pytest.mark.usefixtures("ray_cluster")
def test_two_fsdp_ranks_run_multi_turn_rollouts_like_one(eos_model):
    tok = load_tokenizer(eos_model)
    agent = AgentRollout(environment=RaggedEnvironment, tokenizer=tok, max_turns=3, max_response_tokens=64)
    questions = ["What is 12+30?", "What is 40+43?", "What is 40+42?"]  # they end after 1, 3 and 2 turns
    greedy = SamplingParams(n=2, temperature=0.0, max_new_tokens=8)  # 6 conversations of different lengths
    local = LocalRuntime()
    try:
        one = local.start_groups(plan(eos_model, 1))["policy"]
        expected, _ = agent(one, prompts(tok, questions), greedy)
    finally:
        local.shutdown()
    ray_runtime = RayRuntime(num_cpus=2)
    try:
        two = ray_runtime.start_groups(plan(eos_model, 2))["policy"]
        batch, metrics = agent(two, prompts(tok, questions), greedy)
        batch["advantages"] = torch.linspace(-1, 1, len(batch))[:, None] * batch["response_mask"]
        updated = two.update(batch)
        after, _ = agent(two, prompts(tok, questions), greedy)  # the engine follows the updated weights
    finally:
        ray_runtime.shutdown()
    assert metrics["num_turns/max"] == 3 and metrics["num_turns/min"] == 1  # ended at different turns
    for key in ("input_ids", "attention_mask", "response_mask"):
        assert torch.equal(batch[key], expected[key]), key
    assert (batch["rollout_log_probs"] - expected["rollout_log_probs"]).abs().max() < 1e-4
    assert all(m["rollout_corr/log_prob_abs_diff_max"] < 1e-4 for m in updated)
    assert not torch.equal(after["rollout_log_probs"], batch["rollout_log_probs"])
