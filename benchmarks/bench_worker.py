"""`TimedPolicyWorker`: our PolicyWorker, also reporting the worker-side seconds of each call.

The driver times each phase around the worker-group call (dispatch, serialisation and the
worker's work); this subclass times the work inside the worker, so their difference is the
runtime's overhead. The seconds reach the driver in `update`'s metrics (the only per-step
metrics a worker returns), as `timing_s/<phase>_worker`. Benchmark instrumentation only.
"""

from __future__ import annotations

import time

from typing import Any

from rlhf.workers.dispatch import shard, shard_exact
from rlhf.workers.policy import PolicyWorker


class TimedPolicyWorker(PolicyWorker):
    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._seconds: dict[str, float] = {}

    def _timed(self, key: str, fn, *args):
        start = time.perf_counter()
        out = fn(*args)
        self._seconds[key] = self._seconds.get(key, 0.0) + time.perf_counter() - start
        return out

    @shard
    def generate(self, prompts, sampling):
        return self._timed("timing_s/gen_worker", super().generate, prompts, sampling)

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
