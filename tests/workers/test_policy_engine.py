"""The policy's hybrid engine (rlhf.workers.policy_engine): weights before the KV cache, the actor's weights
sent only when they changed, every sync checked, and sleep only for a worker that trains."""

from __future__ import annotations

import pytest
import torch

from rlhf.rollout.engine import WeightDigest, WeightSyncError
from rlhf.workers.policy_engine import HybridEngine

torch.set_num_threads(1)


class Recorder:
    """An engine with its own copy of one tensor that logs each call; `drops` loses what it is sent."""

    def __init__(self, drops: bool = False):
        self.calls: list[str] = []
        self.held = {"w": torch.zeros(4)}
        self.drops = drops

    def wake_up(self, tags=None):
        self.calls.append(f"wake {','.join(tags) if tags else 'all'}")

    def sleep(self):
        self.calls.append("sleep")

    def update_weights(self, weights):
        for name, tensor in weights:
            self.calls.append(f"update {name}")
            if not self.drops:
                self.held[name] = tensor.clone()

    def weight_digests(self, names):
        return {n: WeightDigest.of(self.held[n]) for n in names if n in self.held}


def actor_weights():
    return iter([("w", torch.arange(4.0))])


def test_a_training_worker_sends_its_changed_weights_between_waking_the_weights_and_the_cache():
    engine = Recorder()
    hybrid = HybridEngine(engine, actor_weights, sleeps=True, rank=0)
    hybrid.wake()  # fresh: the engine was built from the same weights
    hybrid.sleep()  # its weights are undefined after sleep: the next wake sends them
    hybrid.wake()
    assert engine.calls == ["wake all", "sleep", "wake weights", "update w", "wake kv_cache"]
    assert torch.equal(engine.held["w"], torch.arange(4.0)) and not hybrid.stale


def test_an_inference_worker_keeps_its_engine_awake():
    engine = Recorder()
    hybrid = HybridEngine(engine, actor_weights, sleeps=False, rank=0)
    hybrid.sleep()
    hybrid.wake()
    assert engine.calls == ["wake all"]


def test_a_sync_the_engine_did_not_take_is_an_error():
    hybrid = HybridEngine(Recorder(drops=True), actor_weights, sleeps=True, rank=0)
    hybrid.weights_changed()
    with pytest.raises(WeightSyncError, match="did not take the actor's weights"):
        hybrid.wake()


def test_an_engine_that_cannot_show_its_weights_is_warned_about_once(capsys):
    engine = Recorder()
    engine.weight_digests = lambda names: {}
    hybrid = HybridEngine(engine, actor_weights, sleeps=True, rank=3)
    for _ in range(2):
        hybrid.weights_changed()
        hybrid.wake()
    assert capsys.readouterr().out.count("[policy rank 3] warning: Recorder cannot show which weights") == 1
