"""The training step on CUDA (marked gpu: skipped without a CUDA device): bf16 compute with fp32
master weights, the update's log-probs equal to a float32 forward's within bf16 tolerance."""

import pytest
import torch

from helpers import grpo_worker, scored_rollout

pytestmark = pytest.mark.gpu


def test_bf16_compute_update_on_cuda_keeps_fp32_masters_and_moves_every_weight():
    worker = grpo_worker(strategy="ddp", compute_dtype="bfloat16", optimizer=lambda p: torch.optim.AdamW(p, lr=1e-6))
    assert worker.trainer.device.type == "cuda"
    model = worker.trainer.unwrapped()
    assert all(p.dtype == torch.float32 and p.is_cuda for p in model.parameters())
    batch = scored_rollout(worker)  # generated on the GPU under bf16 autocast
    assert batch["responses"].shape[0] == 16 and torch.isfinite(batch["rollout_log_probs"]).all()
    before = worker.parameters_digest()
    metrics = worker.update(batch)
    after = worker.parameters_digest()
    changed = sum(int((before[k] != after[k]).sum()) for k in before) / sum(v.numel() for v in before.values())
    assert changed >= 0.90
    assert all(isinstance(v, float) for v in metrics.values())


def test_bf16_log_probs_on_cuda_match_a_float32_forward():
    fp32, bf16 = grpo_worker(strategy="ddp"), grpo_worker(strategy="ddp", compute_dtype="bfloat16")
    batch = scored_rollout(fp32)
    want = fp32.compute_log_probs(batch)["old_log_probs"]
    got = bf16.compute_log_probs(batch)["old_log_probs"]
    mask = batch["response_mask"].bool()
    assert got.dtype == torch.float32
    torch.testing.assert_close(got[mask], want[mask], atol=0.05, rtol=0.05)  # bf16 matmuls: ~3 significant digits


@pytest.mark.parametrize("strategy", ["fsdp", "cpu_offload"])
def test_fsdp_on_cuda_keeps_fp32_shards_and_equals_ddp(strategy):
    """FSDP2 on NCCL (world size 1) with bf16 compute: fp32 sharded masters on the GPU (or in
    host RAM with CPU offload), the update equal to DDP's within bf16 tolerance."""
    from rlhf.workers.fsdp import FSDP

    fsdp = FSDP(cpu_offload=True) if strategy == "cpu_offload" else "fsdp"
    sgd = lambda p: torch.optim.SGD(p, lr=0.1)  # noqa: E731
    ddp = grpo_worker(strategy="ddp", compute_dtype="bfloat16", optimizer=sgd)
    batch = scored_rollout(ddp)
    sharded = grpo_worker(strategy=fsdp, compute_dtype="bfloat16", optimizer=sgd)
    want_device = "cpu" if strategy == "cpu_offload" else "cuda"
    assert all(p.dtype == torch.float32 and p.to_local().device.type == want_device
               for p in sharded.trainer.model.parameters())
    ddp.update(batch)
    sharded.update(batch)
    a, b = ddp.parameters_digest(), sharded.parameters_digest()
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-2
