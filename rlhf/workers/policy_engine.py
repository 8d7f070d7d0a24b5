"""The policy worker's rollout engine and the state of its weights: wake, sleep, sync, and the sync's check.

The hybrid engine generates with the actor's current weights. An engine that shares the actor's
module (the transformers engine on one device) has them already; one with its own copy (vLLM, or a
transformers engine in another dtype) gets the actor's weights streamed in on the first wake after
they changed (an update, a resume, a sleep that dropped them), and then the engine is asked what it
holds (`SyncCheck`): a sync that silently did nothing raises `WeightSyncError` instead of rolling
out from old weights. A worker that trains puts the engine to sleep after each rollout, so its
KV cache and weights leave the device for the update.
"""

from __future__ import annotations

from collections.abc import Callable

from rlhf.rollout.engine import RolloutEngine, SyncCheck
from rlhf.workers.weight_sync import NamedTensors

__all__ = ["HybridEngine"]


class HybridEngine:
    """Wakes `engine` with the actor's current weights and puts it to sleep; `weights()` streams the actor's
    full weights by Hugging Face name (a collective under FSDP: every rank wakes together)."""

    def __init__(self, engine: RolloutEngine, weights: Callable[[], NamedTensors], sleeps: bool, rank: int):
        self.engine = engine
        self._weights = weights
        self.sleeps = sleeps  # a worker that trains frees the engine's memory for the update; inference keeps it
        self.rank = rank  # for the warning's prefix
        self.stale = False  # the engine's weights may differ from the actor's (update, resume, sleep)
        self._unchecked_warned = False

    @property
    def shares_weights(self) -> bool:
        """Generates with the actor's own module (then it runs under the actor's autocast, and syncs are free)."""
        return getattr(self.engine, "shares_weights", False)

    def weights_changed(self) -> None:
        """The actor's weights changed (an update, a restored checkpoint): send them before the next rollout."""
        self.stale = True

    def sleep(self) -> None:
        """Free the engine's memory for training (a worker that trains; an inference-only one keeps it)."""
        if self.sleeps:
            self.engine.sleep()
            self.stale = True  # after sleep the engine's weights are undefined (vLLM level 2)

    def wake(self) -> None:
        """Weights first, then the KV cache: never old weights, new weights and a KV cache at once."""
        if not self.stale:
            self.engine.wake_up()
            return
        self.engine.wake_up(["weights"])
        if self.shares_weights:  # the actor's own module: nothing to send
            self.engine.wake_up(["kv_cache"])
            self.stale = False
            return
        check = SyncCheck()
        self.engine.update_weights(check.tap(self._weights()))
        self.engine.wake_up(["kv_cache"])
        self._check(check)
        self.stale = False

    def _check(self, check: SyncCheck) -> None:
        """What the engine holds now must be what it was sent (WeightSyncError otherwise); an engine
        that cannot say (no `weight_digests`, or no tensor under its Hugging Face name) is warned about once."""
        compared = check.verify(self.engine) if hasattr(self.engine, "weight_digests") else 0
        if compared == 0 and not self._unchecked_warned:
            self._unchecked_warned = True
            print(f"[policy rank {self.rank}] warning: {type(self.engine).__name__} cannot show which "
                  "weights it holds (weight_digests), so its weight syncs are not verified", flush=True)
