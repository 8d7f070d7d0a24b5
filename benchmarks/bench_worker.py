"""`TimedPolicyWorker`: our PolicyWorker, also reporting the worker-side seconds of each call.

The driver times each phase around the worker-group call (dispatch, serialisation and the
worker's work); this subclass times the work inside the worker, so their difference is the
runtime's overhead; the update's optimizer step and gradient clipping are timed
apart. The seconds reach the driver in `update`'s metrics (the only per-step
metrics a worker returns), as `timing_s/<phase>_worker`. Benchmark instrumentation only.
"""

from __future__ import annotations

import inspect
import time
from typing import Any

import torch

from rlhf.workers.dispatch import on_all_ranks, shard, shard_exact
from rlhf.workers.policy import PolicyWorker


class TimedPolicyWorker(PolicyWorker):
    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._seconds: dict[str, float] = {}
        if self.trainer.optimizer is not None:  # the update's parts: optimizer step, gradient clipping
            optimizer_step, clip = self.trainer.optimizer.step, self.trainer._clip_grad
            self.trainer.optimizer.step = lambda *a, **k: self._timed("timing_s/optimizer_worker", optimizer_step, *a)
            self.trainer._clip_grad = lambda: self._timed("timing_s/clip_worker", clip)

    def _timed(self, key: str, fn, *args, **kwargs):
        start = time.perf_counter()
        out = fn(*args, **kwargs)
        self._seconds[key] = self._seconds.get(key, 0.0) + time.perf_counter() - start
        return out

    @shard
    def generate(self, prompts, sampling, **options):  # options: PolicyWorker.generate's own (keep_awake)
        return self._timed("timing_s/gen_worker", super().generate, prompts, sampling, **options)

    @shard
    def compute_log_probs(self, batch):
        return self._timed("timing_s/old_log_prob_worker", super().compute_log_probs, batch)

    @shard
    def compute_ref_log_probs(self, batch):
        return self._timed("timing_s/ref_worker", super().compute_ref_log_probs, batch)

    @shard_exact
    def update(self, batch):
        out = super().update(batch)
        out.update(self._seconds)
        self._seconds = {}
        return out


# fiddle and preflight read PolicyWorker's arguments (and their defaults) through the signature
TimedPolicyWorker.__signature__ = inspect.signature(PolicyWorker)


class MemoryPolicyWorker(PolicyWorker):
    """Our PolicyWorker with its phases labelled for `bench_memory.PhaseMemory` (`MEMORY`, set by the
    benchmark before the worker is built), the activation bytes of each training micro-batch, and the
    bytes of what it holds for good (weights, gradients, optimizer state). Benchmark instrumentation only."""

    MEMORY = None  # a bench_memory.PhaseMemory, set in the benchmark's process
    held: dict[str, int] = {}
    activations: list[dict[str, int]] = []

    def __init__(self, *args: Any, **kwargs: Any):
        from bench_memory import tensor_bytes

        with self.MEMORY.phase("build"):
            super().__init__(*args, **kwargs)
        phase = self.MEMORY.phase
        trainer = self.trainer
        MemoryPolicyWorker.held = {"actor_weights": tensor_bytes(trainer.unwrapped().parameters()),
                                   "reference_weights": tensor_bytes(self.ref_model.parameters()) if self.ref_model else 0}
        inner_update, inner_step = trainer.update, trainer.optimizer.step
        inner_backward, inner_batched = trainer.accelerator.backward, self._log_probs_batched

        def update(batch, micro_loss):
            from bench_memory import saved_activation_bytes

            def measured(micro, num_tokens, num_seqs):
                with phase("forward"), saved_activation_bytes(list(trainer.model.parameters())) as saved:
                    out = micro_loss(micro, num_tokens, num_seqs)
                MemoryPolicyWorker.activations.append({"rows": len(micro), "width": int(micro["input_ids"].shape[1]),
                                                        "response_width": int(micro["responses"].shape[1]), **saved})
                return out

            return inner_update(batch, measured)

        def step(*a, **k):
            with phase("optimizer"):
                out = inner_step(*a, **k)
            params = [p for p in trainer.model.parameters()]
            state = [t for s in trainer.optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
            MemoryPolicyWorker.held.update(gradients=tensor_bytes(p.grad for p in params),
                                           optimizer_state=tensor_bytes(state))
            return out

        def backward(*a, **k):
            with phase("backward"):
                return inner_backward(*a, **k)

        def batched(model, batch, key):
            with phase(key):
                return inner_batched(model, batch, key)

        trainer.update, trainer.optimizer.step, trainer.accelerator.backward = update, step, backward
        self._log_probs_batched = batched

    @shard
    def generate(self, prompts, sampling, **options):
        with self.MEMORY.phase("generate"):
            return super().generate(prompts, sampling, **options)

    @shard_exact
    def update(self, batch):
        with self.MEMORY.phase("update"):
            return super().update(batch)

    @on_all_ranks
    def save(self, path):
        with self.MEMORY.phase("save"):
            return super().save(path)


MemoryPolicyWorker.__signature__ = inspect.signature(PolicyWorker)
