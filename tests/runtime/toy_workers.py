"""Small real workers for runtime tests (importable by Ray actors through PYTHONPATH)."""

import os

import torch

from rlhf.batch import Batch
from rlhf.workers.dispatch import on_all_ranks, shard, shard_exact


class EchoWorker:
    def __init__(self, scale: float = 1.0):
        self.scale = scale

    @shard
    def double(self, batch: Batch) -> Batch:
        return Batch({"y": batch["x"] * 2 * self.scale}, {"rank": [os.environ.get("RANK", "0")] * len(batch)})

    @shard_exact
    def count(self, batch: Batch) -> int:
        return len(batch)

    @shard_exact
    def rows(self, batch: Batch) -> dict:
        """The shard a training call sees: its rows' x values and token count."""
        return {"x": batch["x"].tolist(), "tokens": int(batch["attention_mask"].sum()) if "attention_mask" in batch else 0}

    @shard
    def samples(self, batch: Batch, n: int) -> Batch:
        """n adjacent result rows per input row, as generation returns n samples per prompt."""
        out = batch.select(["x"]).repeat(n)
        out["sample"] = torch.arange(n).repeat(len(batch))
        return out

    @shard(balance=False)
    def double_contiguous(self, batch: Batch) -> Batch:
        """x * 2, and the shard each row was in (named by its first row's x)."""
        return Batch({"y": batch["x"] * 2, "shard": batch["x"][:1].repeat(len(batch))})

    @on_all_ranks
    def env(self) -> dict:
        keys = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "CUDA_VISIBLE_DEVICES")
        return {k: os.environ.get(k) for k in keys}

    @on_all_ranks
    def where(self) -> dict:
        """The node this rank runs on and what Ray gave it, seen from inside the actor."""
        import ray

        context = ray.get_runtime_context()
        return {
            "node_id": context.get_node_id(),
            "node_ip": ray.util.get_node_ip_address(),
            "gpu_ids": [str(i) for i in context.get_accelerator_ids().get("GPU", [])],
            "resources": context.get_assigned_resources(),
        }

    @on_all_ranks
    def scheduling(self) -> dict:
        """How the OS and torch run this rank: its niceness and its thread counts."""
        return {"niceness": os.nice(0), "torch_threads": torch.get_num_threads(),
                "omp_num_threads": os.environ.get("OMP_NUM_THREADS")}

    @on_all_ranks
    def all_reduce(self, value: float) -> float:
        import torch.distributed as dist

        if not dist.is_initialized():
            dist.init_process_group("gloo")
        t = torch.tensor([value + int(os.environ.get("RANK", "0"))])
        dist.all_reduce(t)
        return float(t)
