"""One GRPO update with 2 Ray workers equals 1 worker on the same global batch.

The 2 workers also cut their micro-batches by tokens (rows grouped by length, trimmed, the same
number of micro-batches on every rank) after the batch was balanced over them by token count,
while the 1 worker cuts rows: the update must not depend on either."""

import pytest
import torch

from rlhf.runtime.local import LocalRuntime
from rlhf.runtime.ray_runtime import RayRuntime
from helpers import group_plan, grpo_worker, scored_rollout


@pytest.mark.slow
@pytest.mark.usefixtures("ray_cluster")
def test_two_workers_match_one_worker_after_an_update():
    batch = scored_rollout(grpo_worker(), prompts=4, n=4)  # 16 rows, ragged response lengths
    local = LocalRuntime()
    one = local.start_groups(group_plan(1))["policy"]
    one.update(batch)
    (expected,) = one.parameters_digest()
    local.shutdown()

    ray_runtime = RayRuntime(num_cpus=2)
    try:
        two = ray_runtime.start_groups(group_plan(2, max_tokens_per_micro_batch=60))["policy"]
        metrics = two.update(batch)
        assert len(metrics) == 2
        assert metrics[0]["actor/micro_batches"] == metrics[1]["actor/micro_batches"]  # FSDP-safe: same count
        rank0, rank1 = two.parameters_digest()
    finally:
        ray_runtime.shutdown()
    for k in expected:
        assert torch.equal(rank0[k], rank1[k]), f"ranks disagree on {k}"
        assert torch.allclose(rank0[k], expected[k], atol=1e-6, rtol=1e-5), f"{k}: 2 workers != 1 worker"
