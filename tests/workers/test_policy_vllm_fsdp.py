"""GRPO-style steps through 2 FSDP2 ranks (gloo, Ray actors), each feeding its own colocated vLLM
engine (the CPU build, vLLM's `external_launcher` on the ranks' process group): after every update
the sharded actor's weights are gathered tensor by tensor and streamed into both engines, so the
trainer-vs-engine log-prob gap of the next step is float rounding, not a stale-weights O(0.1)."""

import fiddle as fdl
import pytest
import torch

from helpers import vllm_model_path
from rlhf.algos import PPOClipLoss
from rlhf.data.generators import arithmetic_rows
from rlhf.data.prompts import PromptDataset
from rlhf.models.loading import load_tokenizer
from rlhf.rollout import SamplingParams
from rlhf.rollout.vllm_engine import VLLMEngine
from rlhf.runtime.plan import compile_graph
from rlhf.runtime.ray_runtime import RayRuntime
from rlhf.workers.objectives import PolicyObjective
from rlhf_configs.pieces import policy_group
from rlhf.workers.training import TrainingSetup

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_two_fsdp_ranks_stream_their_updates_into_vllm():
    path = vllm_model_path()
    plan = compile_graph(policy_group(
        num_workers=2, model_path=path,
        training=fdl.Config(TrainingSetup, strategy="fsdp", micro_batch_size=16, grad_clip=None),
        objective=fdl.Config(PolicyObjective, policy_loss=fdl.Config(PPOClipLoss)),
        optimizer=fdl.Partial(torch.optim.SGD, lr=2.0),  # large steps: stale weights would show at once
        engine=fdl.Partial(VLLMEngine, dtype="float32", max_model_len=256, max_num_seqs=64),
    ))
    prompts = PromptDataset(arithmetic_rows(8, seed=0), load_tokenizer(path)).collate(range(8))
    runtime = RayRuntime(num_cpus=2)
    try:
        policy = runtime.start_groups(plan)["policy"]
        for step in range(3):
            torch.manual_seed(step)
            batch = policy.generate(prompts, SamplingParams(n=4, temperature=1.0, max_new_tokens=8))
            assert len(batch) == 32 and batch["response_mask"].sum(1).min() > 0
            batch["advantages"] = torch.randn(len(batch), 1) * batch["response_mask"]
            for rank, metrics in enumerate(policy.update(batch)):
                # each rank's engine sampled from the actor's current (gathered) weights
                assert metrics["rollout_corr/log_prob_abs_diff"] < 1e-5, (step, rank, metrics)
                assert metrics["rollout_corr/log_prob_abs_diff_max"] < 1e-3, (step, rank, metrics)
        digests = policy.parameters_digest()
        assert all(torch.equal(digests[0][k], digests[1][k]) for k in digests[0])
    finally:
        runtime.shutdown()
