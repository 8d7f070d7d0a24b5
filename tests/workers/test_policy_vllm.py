"""The policy worker with VLLMEngine (the hybrid engine, real vLLM: the CPU build): GRPO-style
steps where the actor's weights stream into the engine after every update.

One rank in this process (LocalRuntime's layout). FSDP2 across ranks is not wired into the
policy worker yet (issue 14); the stream itself gathers DTensors with `full_tensor()`.
"""

import functools

import pytest
import torch

from helpers import vllm_model_path
from rlhf.algos import PPOClipLoss
from rlhf.data.generators import arithmetic_rows
from rlhf.data.prompts import PromptDataset
from rlhf.rollout import HFEngine, SamplingParams
from rlhf.rollout.vllm_engine import VLLMEngine
from rlhf.workers.objectives import PolicyObjective
from rlhf.workers.policy import PolicyWorker
from rlhf.workers.training import TrainingSetup

pytestmark = pytest.mark.vllm

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=8)


def same(a, b) -> bool:
    """The same tokens with the same log-probs (up to float rounding)."""
    return torch.equal(a["responses"], b["responses"]) and torch.allclose(
        a["rollout_log_probs"], b["rollout_log_probs"], atol=1e-5)


@pytest.fixture(scope="module")
def worker():
    engine = functools.partial(VLLMEngine, dtype="float32", max_model_len=256, max_num_seqs=64)
    sgd = functools.partial(torch.optim.SGD, lr=2.0)  # large steps: greedy outputs must change
    return PolicyWorker(vllm_model_path(), objective=PolicyObjective(policy_loss=PPOClipLoss()), optimizer=sgd,
                        engine=engine, training=TrainingSetup(micro_batch_size=16, grad_clip=None))


def test_grpo_steps_sync_the_engine_after_every_update(worker):
    assert isinstance(worker.engine, VLLMEngine)
    data = PromptDataset(arithmetic_rows(8, seed=0), worker.tokenizer)
    prompts = data.collate(range(8))
    actor = HFEngine.sharing(worker.trainer.unwrapped(), worker.tokenizer)  # what the actor itself would say
    # greedy tokens of a random tiny model barely move, so the engine's log-probs of them are compared too
    first = worker.generate(prompts, GREEDY)
    assert same(first, actor.generate(prompts, GREEDY))
    previous = first
    for step in range(3):
        torch.manual_seed(step)
        batch = worker.generate(prompts, SamplingParams(n=4, temperature=1.0, max_new_tokens=8))
        batch["advantages"] = torch.randn(len(batch), 1) * batch["response_mask"]
        metrics = worker.update(batch)
        # the engine sampled from the actor's current weights: the gap is float rounding
        assert metrics["rollout_corr/log_prob_abs_diff"] < 1e-5, metrics
        assert metrics["rollout_corr/log_prob_abs_diff_max"] < 1e-3, metrics
        greedy = worker.generate(prompts, GREEDY)  # first syncs the updated weights
        assert same(greedy, actor.generate(prompts, GREEDY)), step
        assert not same(greedy, previous), f"step {step}: the engine still answers as before the update"
        previous = greedy


def test_a_resumed_worker_syncs_the_loaded_weights(worker, tmp_path):
    """load_state replaces the actor's weights: the next rollout follows them, not the old ones."""
    data = PromptDataset(arithmetic_rows(4, seed=1), worker.tokenizer)
    prompts = data.collate(range(4))
    saved = worker.generate(prompts, GREEDY)
    worker.save_state(str(tmp_path / "ckpt"))
    batch = worker.generate(prompts, SamplingParams(n=4, temperature=1.0, max_new_tokens=8))
    batch["advantages"] = torch.randn(len(batch), 1) * batch["response_mask"]
    worker.update(batch)
    assert not same(worker.generate(prompts, GREEDY), saved)
    worker.load_state(str(tmp_path / "ckpt"))
    assert same(worker.generate(prompts, GREEDY), saved)


class NoOpSyncVLLM(VLLMEngine):
    """Fault: the sync resets the prefix cache but loads no tensor (what a lost bucket or a lost
    adapter looks like from outside: rollouts keep coming from the old weights)."""

    def update_weights(self, weights):
        for _ in weights:
            pass
        self.llm.reset_prefix_cache()


def test_a_sync_that_loads_nothing_into_vllm_is_an_error():
    from rlhf.rollout.engine import WeightSyncError

    engine = functools.partial(NoOpSyncVLLM, dtype="bfloat16", max_model_len=256, max_num_seqs=64)
    worker = PolicyWorker(vllm_model_path(), objective=PolicyObjective(policy_loss=PPOClipLoss()),
                          optimizer=functools.partial(torch.optim.SGD, lr=2.0), engine=engine,
                          training=TrainingSetup(micro_batch_size=16, grad_clip=None))
    prompts = PromptDataset(arithmetic_rows(4, seed=2), worker.tokenizer).collate(range(4))
    batch = worker.generate(prompts, SamplingParams(n=4, temperature=1.0, max_new_tokens=8))
    batch["advantages"] = torch.randn(len(batch), 1) * batch["response_mask"]
    worker.update(batch)
    with pytest.raises(WeightSyncError, match=r"\(NoOpSyncVLLM\) did not take the actor's weights: after the sync, "
                                              r"\d+ of the \d+ tensors checked"):
        worker.generate(prompts, GREEDY)


def test_every_sync_into_vllm_is_checked_on_the_tensors_vllm_keeps_under_their_names(worker):
    """vLLM fuses q/k/v and gate/up; the others (o_proj, down_proj, norms) are compared, and the embedding
    too unless vLLM padded its rows (to a multiple of 64)."""
    from rlhf.rollout.engine import SyncCheck, named_weights

    check = SyncCheck()
    worker.engine.update_weights(check.tap(named_weights(worker.trainer.unwrapped())))
    compared = check.verify(worker.engine)
    names = list(check.sent)
    fused = [n for n in names if any(p in n for p in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"))]
    assert len(names) - len(fused) - 1 <= compared <= len(names) - len(fused)
    assert compared >= 2 * 4 + 1  # per layer o_proj, down_proj and two norms; the final norm
