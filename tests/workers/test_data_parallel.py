"""One GRPO update with 2 Ray workers equals 1 worker on the same global batch."""

import fiddle as fdl
import pytest
import torch

from rlhf.algos import KLLoss, PPOClipLoss, kl_k3
from rlhf.runtime.local import LocalRuntime
from rlhf.runtime.plan import compile_graph
from rlhf.runtime.ray_runtime import RayRuntime
from rlhf.workers.objectives import PolicyObjective
from rlhf.workers.policy import PolicyWorker
from rlhf_configs.pieces import policy_group
from helpers import tiny_model_path
from test_policy_worker import scored_rollout, grpo_worker


def group_plan(num_workers):
    path = tiny_model_path()
    objective = fdl.Config(
        PolicyObjective,
        policy_loss=fdl.Config(PPOClipLoss),
        kl_loss=fdl.Config(KLLoss, estimator=kl_k3, coef=0.1),
    )
    return compile_graph(
        policy_group(
            num_workers=num_workers, model_path=path, ref_model_path=path, objective=objective, micro_batch_size=3
        )
    )


@pytest.mark.slow
def test_two_workers_match_one_worker_after_an_update():
    batch = scored_rollout(grpo_worker(), prompts=4, n=4)  # 16 rows, ragged response lengths
    local = LocalRuntime()
    one = local.start_groups(group_plan(1))["policy"]
    one.update(batch)
    (expected,) = one.parameters_digest()
    local.shutdown()

    ray_runtime = RayRuntime(num_cpus=2)
    try:
        two = ray_runtime.start_groups(group_plan(2))["policy"]
        metrics = two.update(batch)
        assert len(metrics) == 2
        rank0, rank1 = two.parameters_digest()
    finally:
        ray_runtime.shutdown()
    for k in expected:
        assert torch.equal(rank0[k], rank1[k]), f"ranks disagree on {k}"
        assert torch.allclose(rank0[k], expected[k], atol=1e-6, rtol=1e-5), f"{k}: 2 workers != 1 worker"
