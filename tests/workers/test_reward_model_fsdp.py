"""A reward model trained by 2 FSDP2 ranks through Ray (gloo on CPU) equals one rank: whole pairs go to each rank
and stay in one micro-batch under a token budget, and the ranks run the same number of forwards."""

import functools

import fiddle as fdl
import pytest
import torch

from helpers import tiny_model_path
from rlhf.algos import BradleyTerryLoss
from rlhf.data.preferences import PreferenceDataset
from rlhf.models.loading import load_tokenizer
from rlhf.runtime.local import LocalRuntime
from rlhf.runtime.plan import compile_graph
from rlhf.runtime.ray_runtime import RayRuntime
from rlhf.workers.training import TrainingSetup
from rlhf_configs.reward_model import reward_model_group


def pairs(n: int) -> list[dict]:
    """Ragged pairs: replies of 1 to 3n characters."""
    return [{"prompt": [{"role": "user", "content": f"say {k}"}],
             "chosen": [{"role": "assistant", "content": "yes" * (k + 1)}],
             "rejected": [{"role": "assistant", "content": "no" * (2 * k + 1)}]} for k in range(n)]


def plan(workers: int):
    return compile_graph(reward_model_group(
        num_workers=workers, model_path=tiny_model_path(), max_length=128,
        loss=fdl.Config(BradleyTerryLoss, center_rewards_coefficient=0.01),
        optimizer=fdl.Partial(torch.optim.SGD, lr=0.1),  # the update is lr x gradient: weights compare gradients
        training=fdl.Config(TrainingSetup, strategy="fsdp", max_tokens_per_micro_batch=120),
    ))


@pytest.mark.slow
@pytest.mark.usefixtures("ray_cluster")
def test_two_fsdp_ranks_train_a_reward_model_as_one_rank():
    data = PreferenceDataset(pairs(8), load_tokenizer(tiny_model_path()), max_length=128)
    batch = data.collate(range(8))
    local = LocalRuntime()
    try:
        one = local.start_groups(plan(1))["rm"]
        one.update(batch)
        (expected,) = one.parameters_digest()
        scores = one.compute_scores(batch)["rm_scores"]
    finally:
        local.shutdown()
    ray_runtime = RayRuntime(num_cpus=2)
    try:
        two = ray_runtime.start_groups(plan(2))["rm"]
        metrics = two.update(batch)
        rank0, rank1 = two.parameters_digest()
        scores_two = two.compute_scores(batch)["rm_scores"]
    finally:
        ray_runtime.shutdown()
    assert metrics[0]["rm/micro_batches"] == metrics[1]["rm/micro_batches"] > 1
    assert all(torch.equal(rank0[k], rank1[k]) for k in rank0), "the ranks' gathered weights differ"
    assert max(float((rank0[k] - expected[k]).abs().max()) for k in expected) < 1e-5, "2 FSDP ranks != 1 rank"
    torch.testing.assert_close(scores_two, scores, atol=1e-5, rtol=1e-5)
