"""The asynchronous rollout's scheduling (RolloutPipeline), driven by a producer and a trainer that take random
times: the staleness bound holds, a fixed lag gives exactly the scheduled versions, a dropped batch is counted,
the transport is never asked for a version it was allowed to drop, and a checkpoint pause keeps what it must."""

import threading
import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhf.batch import Batch
from rlhf.trainers.async_rollout import Rollout, RolloutPipeline, read_rollouts, write_rollouts

STEPS = 8


class RolloutSide:
    """The rollout group as the pipeline sees it: it holds one version, generates with it (taking the given
    times), and loads only versions the transport still keeps."""

    def __init__(self, gen_times, load_times=(0.0,)):
        self.gen_times = gen_times
        self.load_times = load_times
        self.version = None
        self.kept: set[int] = set()
        self.loads: list[int] = []
        self.lock = threading.Lock()

    def send(self, version: int, keep_from: int) -> None:  # the trainer's publish
        with self.lock:
            self.kept = {v for v in self.kept if v >= keep_from} | {version}

    def load(self, version: int) -> None:
        with self.lock:
            assert version in self.kept, f"asked the transport for version {version}, which it may have dropped"
        time.sleep(self.load_times[len(self.loads) % len(self.load_times)])  # a transfer takes time
        with self.lock:
            assert version in self.kept, f"version {version} was dropped while it was being loaded"
        self.loads.append(version)
        self.version = version

    def produce(self, index: int, version: int):
        assert self.version == version, "generating with other weights than the pipeline scheduled"
        time.sleep(self.gen_times[(index - 1) % len(self.gen_times)])
        batch = Batch({"policy_version": torch.full((4,), self.version, dtype=torch.int64)})
        return batch, {"timing_s/gen": 0.0}


def run(pipeline: RolloutPipeline, side: RolloutSide, update_times, steps=STEPS):
    """The trainer: take, 'update', publish; returns [(step, rollout, metrics)]."""
    taken = []
    pipeline.publish(0, side.send)
    pipeline.start()
    try:
        for step in range(1, steps + 1):
            item, metrics = pipeline.take(step)
            taken.append((step, item, metrics))
            time.sleep(update_times[(step - 1) % len(update_times)])
            pipeline.publish(step, side.send)
    finally:
        pipeline.close()
    return taken


timings = st.lists(st.floats(0.0, 0.004), min_size=1, max_size=5)


@settings(max_examples=40)
@given(gen=timings, update=timings, load=timings, max_staleness=st.integers(0, 3), mode=st.sampled_from(
    [("wait", "newest"), ("drop", "newest"), ("wait", "fixed_lag")]), extra_capacity=st.integers(0, 3))
def test_the_staleness_bound_holds_whatever_the_timings(gen, update, load, max_staleness, mode, extra_capacity):
    on_stale, weights = mode
    side = RolloutSide(gen, load)
    pipeline = RolloutPipeline(side.produce, side.load, max_staleness=max_staleness, on_stale=on_stale,
                               weights=weights, capacity=max_staleness + 1 + extra_capacity,
                               last_index=STEPS if on_stale == "wait" else None)
    taken = run(pipeline, side, update)
    assert [step for step, _, _ in taken] == list(range(1, STEPS + 1))
    dropped = 0
    for step, item, metrics in taken:
        versions = item.batch["policy_version"]
        assert bool((versions == item.version).all())  # every sample carries its version
        staleness = step - 1 - versions
        assert int(staleness.max()) <= max_staleness and int(staleness.min()) >= 0
        assert metrics["async/staleness/max"] == float(staleness.max()) <= max_staleness
        assert metrics["async/queue_size"] <= pipeline.capacity
        dropped += metrics["async/dropped"]
        if on_stale == "wait":
            assert item.index == step and metrics["async/dropped"] == 0  # nothing dropped, nothing skipped
        if weights == "fixed_lag":
            assert item.version == max(0, step - 1 - max_staleness)  # exactly the scheduled version
    assert dropped == taken[-1][2]["async/dropped_total"]
    indices = [item.index for _, item, _ in taken]
    assert indices == sorted(indices)


def test_a_batch_past_the_bound_is_dropped_and_counted():
    """Generation far faster than updates and room to run ahead: the producer queues batches with version 0
    that are too old once the trainer reaches them."""
    side = RolloutSide([0.0])
    pipeline = RolloutPipeline(side.produce, side.load, max_staleness=0, on_stale="drop", capacity=4)
    pipeline.publish(0, side.send)
    pipeline.start()
    time.sleep(0.2)  # the queue fills with version-0 batches
    try:
        first, m1 = pipeline.take(1)
        pipeline.publish(1, side.send)
        second, m2 = pipeline.take(2)  # the 3 other version-0 batches are 1 version old now: dropped
    finally:
        pipeline.close()
    assert first.version == 0 and m1["async/dropped"] == 0
    # the 3 queued version-0 batches, and a 4th if the producer refilled the freed slot before version 1 was out
    assert second.version == 1 and m2["async/dropped"] in (3 * 4, 4 * 4)
    assert m2["async/dropped_total"] == m2["async/dropped"]
    assert m2["async/staleness/max"] == 0


def test_without_a_bound_wait_the_producer_waits_for_the_version_it_needs():
    """max_staleness=0 with waiting: batch k is generated only once version k-1 is out (no overlap)."""
    side = RolloutSide([0.0])
    pipeline = RolloutPipeline(side.produce, side.load, max_staleness=0, last_index=3)
    taken = run(pipeline, side, [0.01], steps=3)
    assert [(item.index, item.version) for _, item, _ in taken] == [(1, 0), (2, 1), (3, 2)]
    assert side.loads == [0, 1, 2]


def test_a_checkpoint_pause_keeps_every_batch_the_checkpoint_has_no_weights_for():
    """Fixed lag 2: at a checkpoint after step 3 (version 3), batches 4 and 5 need versions 1 and 2, which the
    checkpoint will not hold: the pause waits until they are generated and hands them over."""
    side = RolloutSide([0.02])
    pipeline = RolloutPipeline(side.produce, side.load, max_staleness=2, weights="fixed_lag", last_index=10)
    pipeline.publish(0, side.send)
    pipeline.start()
    try:
        for step in (1, 2, 3):
            pipeline.take(step)
            pipeline.publish(step, side.send)
        queued, state = pipeline.pause(3)
        assert [(r.index, r.version) for r in queued][:2] == [(4, 1), (5, 2)]
        assert all(r.version < 3 or r.version == 3 for r in queued)
        assert state["next_index"] == 4 + len(queued)
        time.sleep(0.05)
        assert pipeline.pause(3)[1] == state  # paused: nothing new is produced
        pipeline.unpause()
        item, _ = pipeline.take(4)
        assert (item.index, item.version) == (4, 1)
    finally:
        pipeline.close()


def test_a_producer_error_reaches_the_trainer():
    def produce(index, version):
        raise ValueError("the reward model is down")

    pipeline = RolloutPipeline(produce, lambda v: None, max_staleness=1, last_index=3)
    pipeline.publish(0, lambda v, k: None)
    pipeline.start()
    with pytest.raises(ValueError, match="the reward model is down") as err:  # its own error: a one-line one stays so
        pipeline.take(1)
    assert any("raised in the rollout producer thread" in note for note in err.value.__notes__)
    pipeline.close()


def test_queued_rollouts_round_trip_through_a_checkpoint_folder(tmp_path):
    batch = Batch({"responses": torch.arange(6).reshape(2, 3), "policy_version": torch.tensor([1, 1]),
                   "rollout_log_probs": torch.tensor([[-0.5, -1.25, 0.0], [-2.0, 0.0, 0.0]])},
                  {"uid": ["a", "b"], "extra_info": [{"index": 3}, {"index": 4, "split": "train"}],
                   "ground_truth": ["7", "8"]}, {"temperature": 1.0, "max_new_tokens": 3})
    write_rollouts(tmp_path, [Rollout(5, 1, batch, {"timing_s/gen": 0.25})])
    (back,) = read_rollouts(tmp_path)
    assert (back.index, back.version, back.metrics) == (5, 1, {"timing_s/gen": 0.25})
    assert back.batch.meta == batch.meta and back.batch.keys() == batch.keys()
    for k in batch.tensors:
        assert torch.equal(back.batch[k], batch[k])
    for k in batch.non_tensors:
        assert list(back.batch[k]) == list(batch[k])
