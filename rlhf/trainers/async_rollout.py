"""Where an RL step takes its scored batch from: generated when asked (synchronous, a queue of depth 0), or
from a bounded queue that a rollout group fills ahead of the trainer (asynchronous, docs/async.md).

Versions: the trainer's weights after step k are policy version k (version 0: the starting weights). Step
k trains on one batch at version k-1; a sample generated with version v is `staleness` (k-1) - v versions
old when it is trained on. Every sample carries its version (`policy_version`, set by the rollout worker).

`AsyncRollout` (a graph node of `RLTrainer`) runs a producer thread in the driver: it takes prompts,
makes the rollout group load the weights it should generate with, generates and scores a batch (the
trainer's own production code, so reward models, ReMax's baseline and DAPO's rounds run there too), and
queues it. The trainer takes batches from the queue and, after each update, publishes its new weights to
the rollout side (`rlhf.workers.weight_sync`). `max_staleness` bounds how old a trained sample may be; a
batch past the bound is waited for (`on_stale="wait"`: the producer never starts a batch that would be
too old when its step comes) or dropped (`"drop"`: the producer runs freely, the trainer discards).

Which weights a batch is generated with (`weights`):
- `"newest"`: the newest published version (peers' streaming: AReaL, TRL's async GRPO, prime-rl); what a
  run trains on then depends on timing, so two runs differ, interrupted or not.
- `"fixed_lag"`: exactly version max(0, k-1-max_staleness) for the batch of step k (verl's one step
  off policy at max_staleness=1: batch k+1 is generated with the weights of version k-1 while the
  trainer updates on batch k); a run is reproducible, and a resumed run ends bit-identical.

Checkpoints hold the batches already generated, with their versions (`rollout_queue/`): the producer is
paused after the batch it is making (with a fixed lag, after every batch that needs a version older than
the checkpoint's), the queue and the data position are saved, and a resumed run trains on exactly those
batches before generating new ones from the checkpoint's weights.

Partial rollouts (`partial_rollouts=True`, streaming only; rlhf.agents.partial): multi-turn conversations outlive
their batch, the producer loads the newest published weights between turns (`RolloutPipeline.refresh`), every
turn keeps its version, and a batch's version is its oldest token's; a checkpoint keeps the prompts of the
conversations still running (`POOL_FILE`) to restart them on resume.

Placement is the rollout group's: its own resources (generation and training overlap), or colocated with
the policy group (one device, time-sliced: the producer and the trainer take turns, and the engine sleeps
while the trainer runs).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import itertools
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from rlhf.batch import Batch
from rlhf.choices import check_choice
from rlhf.ranges import NonNegativeInt, PositiveInt

OnStale = Literal["wait", "drop"]
Weights = Literal["newest", "fixed_lag"]
Transport = Literal["auto", "broadcast", "object_store"]
log = logging.getLogger(__name__)

QUEUE_FOLDER = "rollout_queue"  # in a checkpoint: the batches generated ahead of the trainer
POOL_FILE = "partial_pool.json"  # in a checkpoint: the prompts of the conversations running (partial rollouts)
SEED_STRIDE_PER_CALL = 1_000_000_007  # seed offset between the generate calls of one rollout (a prime)

# produce(prompts, more_prompts, timing, generate) -> (scored batch, metrics): RLTrainer's production code
Produce = Callable[..., tuple[Batch, dict[str, float]]]


def staleness_metrics(batch: Batch, step: int) -> dict[str, float]:
    """`async/staleness/mean|max` of a batch trained at step `step` (policy version step-1), counted per sample
    against its oldest token; with per-token versions (`token_policy_version`, multi-turn rollouts) also how
    many versions each sample's sampled tokens span (`async/versions_per_sample/*`) and how many samples span
    more than one (`async/partial_samples`: conversations continued on newer weights, partial rollouts)."""
    stale = (step - 1 - batch["policy_version"]).float()
    metrics = {"async/staleness/mean": float(stale.mean()), "async/staleness/max": float(stale.max())}
    if "token_policy_version" in batch:
        spans = versions_per_sample(batch["token_policy_version"]).float()
        metrics.update({"async/versions_per_sample/mean": float(spans.mean()),
                        "async/versions_per_sample/max": float(spans.max()),
                        "async/partial_samples": float((spans > 1).sum())})
    return metrics


def versions_per_sample(token_versions: torch.Tensor) -> torch.Tensor:
    """(B,) the number of distinct policy versions among each row's sampled tokens (`token_policy_version`
    (B,T), -1 where nothing was sampled); 0 for a row that sampled nothing."""
    ordered = token_versions.sort(dim=1).values
    changes = (ordered[:, 1:] != ordered[:, :-1]) & (ordered[:, 1:] >= 0)
    return changes.sum(dim=1) + (ordered[:, :1] >= 0).squeeze(1).long()


# --------------------------------------------------------------------------------------- synchronous
class SyncRollout:
    """Depth 0: each step's batch is generated when the step asks, with the policy group's own engine
    (the hybrid engine, whose weights are always the trainer's: version step-1, staleness 0)."""

    def __init__(self, produce: Produce, prompts: Iterator[Batch]):
        self.produce = produce
        self.prompts = prompts

    def take(self, step: int, timing: dict[str, float]) -> tuple[Batch, dict[str, float]]:
        batch, metrics = self.produce(next(self.prompts), lambda: next(self.prompts), timing)
        batch["policy_version"] = torch.full((len(batch),), step - 1, dtype=torch.int64)
        return batch, metrics

    def after_update(self, step: int, timing: dict[str, float]) -> dict[str, float]:
        return {}  # the engine shares (or syncs itself from) the actor

    @contextlib.contextmanager
    def checkpoint(self, step: int) -> Iterator[QueuedRollouts]:
        yield QueuedRollouts({"data_position": getattr(self.prompts, "position", None)}, [])

    def close(self) -> None:
        pass


# ------------------------------------------------------------------------------------ the pipeline
@dataclasses.dataclass
class Rollout:
    """One produced batch: its production index (the step it is for when nothing is dropped), the
    policy version that generated it, the scored batch, and its production metrics."""

    index: int
    version: int
    batch: Batch
    metrics: dict[str, float]


@dataclasses.dataclass
class QueuedRollouts:
    """What a checkpoint keeps of a rollout source: JSON state, and the batches generated ahead."""

    state: dict[str, Any]
    rollouts: list[Rollout]
    pool: list[dict] = dataclasses.field(default_factory=list)  # partial rollouts: groups to restart on resume

    def write(self, folder: Path) -> None:
        if self.rollouts:
            write_rollouts(Path(folder) / QUEUE_FOLDER, self.rollouts)
        if self.pool:
            (Path(folder) / POOL_FILE).write_text(json.dumps(self.pool, default=_plain))


class RolloutPipeline:
    """The producer thread and the bounded queue between it and the trainer (the scheduling only:
    generation and weight loading are the callables it is given).

    `produce(index, version)` makes the batch of production `index` with the rollout side's weights at
    `version`, which `load(version)` puts there first when they differ. Productions are numbered from 1
    (production k is for step k unless batches are dropped). `device_turn`: a lock the producer holds
    while it loads and generates, and the trainer between `take`s (one device, time-sliced).
    """

    def __init__(
        self,
        produce: Callable[[int, int], tuple[Batch, dict[str, float]]],
        load: Callable[[int], None],
        *,
        max_staleness: int,
        on_stale: OnStale = "wait",
        weights: Weights = "newest",
        capacity: int | None = None,
        next_index: int = 1,
        last_index: int | None = None,
        queued: list[Rollout] | tuple[Rollout, ...] = (),
        dropped_total: int = 0,
        device_turn: threading.Lock | None = None,
    ):
        self._produce, self._load = produce, load
        self.max_staleness = max_staleness
        self.on_stale = on_stale
        self.fixed_lag = weights == "fixed_lag"
        self.capacity = capacity if capacity is not None else max_staleness + 1
        self._next_index = next_index
        self._last_index = last_index
        self._queue: collections.deque[Rollout] = collections.deque(queued)
        self._dropped_total = dropped_total
        self._device = device_turn
        self._trainer_holds_device = False
        self._cond = threading.Condition()
        self._published: int | None = None  # the newest version the trainer published
        self._first_published: int | None = None  # no weights older than this exist in this run (a resumed one)
        self._loaded: int | None = None  # the version the rollout side holds (None: not known to be any)
        self._loading: int | None = None  # the version the producer is loading or generating with
        self._producing = False
        self._pause_below: int | None = None  # checkpoint: produce only what needs a version below this
        self._stopping = False
        self._error: BaseException | None = None
        self._rollout_idle = 0.0
        self._weight_sync = 0.0
        self._thread = threading.Thread(target=self._loop, name="rollout-producer", daemon=True)

    # ------------------------------------------------------------------ rules
    def target(self, index: int) -> int:
        """The oldest version production `index` may be generated with (exactly this one with a fixed lag)."""
        return max(0, index - 1 - self.max_staleness)

    def _may_produce(self) -> bool:
        index = self._next_index
        if self._published is None or (self._last_index is not None and index > self._last_index):
            return False
        target = self.target(index)
        if self._pause_below is not None and not (self.fixed_lag and target < self._pause_below):
            return False
        if (self.fixed_lag or self.on_stale == "wait") and self._published < target:
            return False
        return len(self._queue) < self.capacity

    # --------------------------------------------------------------- producer
    def start(self) -> None:
        self._thread.start()

    def _loop(self) -> None:
        try:
            while True:
                with self._cond:
                    waited = time.perf_counter()
                    while not self._may_produce():
                        if self._stopping:
                            return
                        self._cond.wait()
                    if self._stopping:
                        return
                    self._rollout_idle += time.perf_counter() - waited
                    index = self._next_index
                    version = self.target(index) if self.fixed_lag else self._published
                    if version < self._first_published:
                        raise RuntimeError(
                            f"rollout {index} is to be generated with policy version {version}, but this run's "
                            f"weights start at version {self._first_published}: the checkpoint it resumed from "
                            "should have held that rollout (a checkpoint written without its rollout queue?)")
                    self._loading, self._producing = version, True
                with self._turn():
                    if version != self._loaded:
                        started = time.perf_counter()
                        self._load(version)
                        self._loaded = version
                        with self._cond:
                            self._weight_sync += time.perf_counter() - started
                    batch, metrics = self._produce(index, version)
                    if "policy_version" in batch:  # partial rollouts: carried conversations hold older tokens
                        version = int(batch["policy_version"].min())
                with self._cond:
                    self._queue.append(Rollout(index, version, batch, metrics))
                    self._next_index += 1
                    self._loading, self._producing = None, False
                    self._cond.notify_all()
        except BaseException as err:  # noqa: BLE001 - handed to the trainer by `take`
            with self._cond:
                self._error, self._producing = err, False
                self._cond.notify_all()

    def refresh(self) -> None:
        """Between the generate calls of a production (partial rollouts; the producer thread): load the newest
        published weights when they are newer than the rollout side's."""
        with self._cond:
            version = self._published
            if version is None or version == self._loaded:
                return
            self._loading = version  # kept by the transport until loaded (`publish`)
        started = time.perf_counter()
        self._load(version)
        with self._cond:
            self._loaded = version
            self._weight_sync += time.perf_counter() - started

    @contextlib.contextmanager
    def _turn(self) -> Iterator[None]:
        if self._device is None:
            yield
            return
        waited = time.perf_counter()
        with self._device:
            with self._cond:
                self._rollout_idle += time.perf_counter() - waited
            yield

    # ---------------------------------------------------------------- trainer
    def publish(self, version: int, send: Callable[[int, int], None]) -> None:
        """The trainer's weights are now `version`: `send(version, keep_from)` hands them to the transport,
        which may drop every version below `keep_from` (none of those will be loaded again)."""
        with self._cond:
            keep = [v for v in (self._loading, self._published) if v is not None]
            if self.fixed_lag:
                keep.append(self.target(self._next_index))
            keep_from = min(keep + [version])
        send(version, keep_from)
        with self._cond:
            self._published = version
            if self._first_published is None:
                self._first_published = version
            self._cond.notify_all()

    def take(self, step: int) -> tuple[Rollout, dict[str, float]]:
        """The next batch within the staleness bound for `step` (trained at version step-1), and the async
        metrics of getting it; a batch past the bound is dropped (`on_stale="drop"`)."""
        started = time.perf_counter()
        self._release_device()
        dropped = 0
        with self._cond:
            while True:
                if self._error is not None:
                    raise self._producer_error()
                if self._queue:
                    item = self._queue.popleft()
                    stale = step - 1 - item.version
                    if self.on_stale == "wait" and item.index != step:  # nothing is dropped: rollout k is step k's
                        raise RuntimeError(f"step {step} got rollout {item.index}: the queue lost or repeated a batch "
                                           "(a checkpoint written without its rollout queue?)")
                    if stale <= self.max_staleness:
                        break
                    if self.on_stale != "drop":
                        raise RuntimeError(f"rollout {item.index} (version {item.version}) is {stale} versions old at "
                                           f"step {step}, past max_staleness={self.max_staleness}: a scheduling bug")
                    dropped += len(item.batch)
                    self._dropped_total += len(item.batch)
                    self._cond.notify_all()  # room in the queue
                    continue
                if not self._producing and not self._may_produce():
                    raise RuntimeError(f"step {step} wants a batch but the rollout producer can make none "
                                       f"(next production {self._next_index}, last {self._last_index})")
                self._cond.wait()
            self._cond.notify_all()  # room in the queue
            queue_size = len(self._queue)
            rollout_idle, self._rollout_idle = self._rollout_idle, 0.0
            weight_sync, self._weight_sync = self._weight_sync, 0.0
        self._acquire_device()
        metrics = {
            **staleness_metrics(item.batch, step),
            "async/dropped": float(dropped),
            "async/dropped_total": float(self._dropped_total),
            "async/queue_size": float(queue_size),
            "async/trainer_idle_s": time.perf_counter() - started,
            "async/rollout_idle_s": rollout_idle,
            "async/weight_sync_s": weight_sync,
        }
        return item, metrics

    def _producer_error(self) -> BaseException:
        """The producer thread's own error, to raise in the trainer: an explained one (a strict scorer's
        `ScorerError`) then ends the run in its one line, as in synchronous rollout; any other keeps the
        producer's traceback, with a note saying where it was raised."""
        err = self._error
        note = "(raised in the rollout producer thread, rlhf.trainers.async_rollout)"
        if note not in getattr(err, "__notes__", ()):
            err.add_note(note)
        return err

    def _release_device(self) -> None:
        if self._device is not None and self._trainer_holds_device:
            self._device.release()
            self._trainer_holds_device = False

    def _acquire_device(self) -> None:
        if self._device is not None and not self._trainer_holds_device:
            self._device.acquire()
            self._trainer_holds_device = True

    # ------------------------------------------------------------ checkpoints
    def pause(self, version: int) -> tuple[list[Rollout], dict[str, int]]:
        """Stop the producer for a checkpoint at trainer `version`: after the batch it is making, and with
        a fixed lag after every batch that needs a version below `version` (the checkpoint will not hold
        those weights). Returns the queue and the state to resume from; `unpause` continues."""
        holds = self._trainer_holds_device
        self._release_device()  # a time-sliced producer needs the device to finish
        with self._cond:
            self._pause_below = version
            self._cond.notify_all()
            while self._producing or (self._may_produce() and not self._stopping):
                if self._error is not None:
                    raise self._producer_error()
                self._cond.wait()
            queued = list(self._queue)
            state = {"next_index": self._next_index, "dropped_total": self._dropped_total}
        if holds:
            self._acquire_device()
        return queued, state

    def unpause(self) -> None:
        with self._cond:
            self._pause_below = None
            self._cond.notify_all()

    def close(self, timeout: float = 600.0) -> None:
        """Stop the producer (it finishes the batch it is making) and give the device back."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._release_device()
        if self._thread.is_alive():
            self._thread.join(timeout)


# ----------------------------------------------------------------------------------- the graph node
class AsyncRollout:
    """Asynchronous rollout: a rollout group generates ahead of the trainer, at most `max_staleness`
    policy versions behind (the module docstring has the rules; docs/async.md when it pays)."""

    def __init__(
        self,
        rollout,  # WorkerGroup of RolloutWorker: its own resources, or colocated with the policy (time-sliced)
        max_staleness: NonNegativeInt = 1,  # versions a trained sample may lag the trainer (0: no overlap)
        on_stale: OnStale = "wait",  # past the bound: "wait" (never generate too far ahead) or "drop" the batch
        weights: Weights = "newest",  # "newest" published version, or exactly "fixed_lag" = max_staleness behind
        # weights to the rollout side: torch.distributed "broadcast" or Ray's "object_store"; "auto": NCCL broadcast
        # between GPUs of their own, else the object store (on CPUs it was faster: benchmarks/weight_sync.py; in
        # one process it is the snapshot itself; NCCL cannot pair two ranks on one GPU)
        transport: Transport = "auto",
        max_queued: PositiveInt | None = None,  # batches waiting in the queue at most; None: max_staleness + 1
        # multi-turn conversations outlive their batch and continue on newer weights (rlhf.agents.partial). Off by
        # default: a batch then holds the groups that ended first, not its own prompts; conversations that outlive
        # the bound are dropped (a bias against long ones, counted in async/partial_dropped); a resumed run
        # restarts the running ones from their prompts. Streaming only (weights="newest", on_stale="wait")
        partial_rollouts: bool = False,
    ):
        check_choice("AsyncRollout.on_stale", on_stale, OnStale)
        check_choice("AsyncRollout.weights", weights, Weights)
        check_choice("AsyncRollout.transport", transport, Transport)
        if weights == "fixed_lag" and on_stale == "drop":
            raise ValueError("AsyncRollout: with weights='fixed_lag' no batch is ever past the bound; use on_stale='wait'")
        if partial_rollouts and (weights != "newest" or on_stale != "wait"):
            raise ValueError(
                f"AsyncRollout(partial_rollouts=True) continues conversations on the newest weights and drops each one "
                f"that outlives max_staleness itself, so it needs weights='newest' and on_stale='wait' (got "
                f"weights={weights!r}, on_stale={on_stale!r}): use fiddler:streaming(partial_rollouts=True)")
        self.rollout = rollout
        self.max_staleness = max_staleness
        self.on_stale = on_stale
        self.weights = weights
        self.transport = transport
        self.max_queued = max_queued
        self.partial_rollouts = partial_rollouts
        # set by `start` for one run
        self._carry = None  # partial rollouts: the pool of conversations carried between batches (PartialRollouts)
        self.policy = None
        self._pipeline: RolloutPipeline | None = None
        self._transport: Transport = transport
        self._prompts: Iterator[Batch] | None = None
        self._drawn = 0  # prompt batches taken from the data: the data position of an in-memory dataset
        self._dtype = None
        self._refs: dict[int, Any] = {}  # object store: the snapshot of each version still needed

    @staticmethod
    def describe_plan(arguments: Mapping[str, Any], groups: Mapping[str, Any]) -> str:
        """The plan's line: the mode, and where the rollout group runs (its own resources, or time-sliced)."""
        s, weights, on_stale = arguments["max_staleness"], arguments["weights"], arguments["on_stale"]
        if weights == "fixed_lag":
            mode = ("one step off: batch k+1 is generated with the weights of version k-1 while batch k trains"
                    if s == 1 else f"{s} steps off: batch k is generated with the weights of version k-1-{s}")
        else:
            mode = f"streaming with the newest weights, at most {s} versions stale ({on_stale} past the bound)"
            if arguments.get("partial_rollouts"):
                mode += ("; partial rollouts: conversations running at a weight update continue on the new weights, "
                         "every token tagged with its version")
        name = getattr(arguments["rollout"], "name", None)
        spec = groups.get(name)
        if spec is not None and spec.colocate_with:
            where = (f"group {name!r} colocated with {spec.colocate_with!r}: time-sliced, one of them runs at a "
                     "time and the engine sleeps while the trainer runs")
        else:
            where = f"group {name!r} on its own resources: generation overlaps training"
        how = {"broadcast": "torch.distributed broadcast (gloo on CPU, NCCL on GPU)",
               "object_store": "Ray's object store (in-process: handed over)",
               "auto": "NCCL broadcast between GPUs of their own, else Ray's object store (in-process: handed "
                       "over)"}[arguments["transport"]]
        return f"async rollout: {mode}; {where}; weights after each update by {how}"

    # -------------------------------------------------------------------- run
    def start(
        self,
        *,
        policy,  # WorkerGroup of PolicyWorker (PublishesWeights)
        produce: Produce,
        prompts_from: Callable[[int, Mapping[str, int] | None], Iterator[Batch]],  # (batches drawn, stream position)
        start_step: int,
        total_steps: int,
        seed: int,
        resumed: tuple[Mapping[str, Any], Path] | None = None,  # (checkpoint state, checkpoint folder)
        carry=None,  # partial rollouts: the rollout producer's pool (rlhf.agents.partial.PartialRollouts)
    ) -> AsyncRollout:
        """Begin producing for steps start_step+1 .. total_steps (a resumed run first trains on the batches
        its checkpoint queued, after restarting the conversations it held running)."""
        if self.partial_rollouts and carry is None:
            raise ValueError("AsyncRollout(partial_rollouts=True) needs the rollout producer's pool of conversations "
                             "(RLTrainer passes it for an AgentRollout)")
        self.policy = policy
        self._carry = carry if self.partial_rollouts else None
        if self._carry is not None and resumed is not None and (resumed[1] / POOL_FILE).exists():
            self._carry.restart(json.loads((resumed[1] / POOL_FILE).read_text()))
            log.warning("restarting %d conversation group(s) that were running at %s from their prompts (an "
                        "environment's state is not saved)", len(self._carry.pending()), resumed[1].name)
        state, queued = {}, []
        if resumed is not None and resumed[0]:
            state = dict(resumed[0])
            queued = read_rollouts(resumed[1] / QUEUE_FOLDER) if (resumed[1] / QUEUE_FOLDER).exists() else []
        next_index = int(state.get("next_index", start_step + 1))
        self._drawn = int(state.get("drawn", start_step))
        self._prompts = prompts_from(self._drawn, state.get("data_position"))
        self._dtype = self.rollout.weights_dtype()[0]
        self._refs = {}
        time_sliced = getattr(self.rollout.spec, "colocate_with", None) is not None
        self._transport = self.transport
        if self.transport == "auto":
            own_gpus = self.rollout.spec.gpus_per_worker > 0 and not time_sliced
            self._transport = "broadcast" if own_gpus and not getattr(self.rollout, "in_process", False) else "object_store"
        if self._transport == "broadcast":
            address = policy.serve_weights(self.rollout.world_size)[0]
            self.rollout.connect_weights(address, self.rollout.world_size)

        def produce_one(index: int, version: int) -> tuple[Batch, dict[str, float]]:
            timing: dict[str, float] = {}
            rollout_seed = seed * 1_000_003 + index  # the same batch whatever ran before it (exact resume)
            calls = itertools.count()  # an agent loop's turns, DAPO's rounds: each call samples with its own seed

            def generate(prompts: Batch, sampling) -> Batch:
                if self._carry is not None:  # partial rollouts: every turn on the newest weights
                    self._pipeline.refresh()
                return self.rollout.generate(prompts, sampling, rollout_seed + next(calls) * SEED_STRIDE_PER_CALL)

            extra = {}
            if self._carry is not None:
                self._carry.oldest_allowed = self._pipeline.target(index)
                extra = {"carry": self._carry}
            batch, metrics = produce(self._next_prompts(), self._next_prompts, timing, generate=generate, **extra)
            if time_sliced:
                self.rollout.sleep()
            if "policy_version" not in batch:  # nothing sampled (every environment's reset failed): no stale token
                batch["policy_version"] = torch.full((len(batch),), version, dtype=torch.int64)
            self._check_versions(index, version, batch)
            return batch, {**metrics, **timing}

        self._pipeline = RolloutPipeline(
            produce_one, self._load, max_staleness=self.max_staleness, on_stale=self.on_stale, weights=self.weights,
            capacity=self.max_queued, next_index=next_index,
            last_index=total_steps if self.on_stale == "wait" else None, queued=queued,
            dropped_total=int(state.get("dropped_total", 0)), device_turn=threading.Lock() if time_sliced else None,
        )
        self._pipeline.publish(start_step, self._send)  # the rollout side starts from the trainer's weights
        self._pipeline.start()
        return self

    def _check_versions(self, index: int, version: int, batch: Batch) -> None:
        """A batch holds only the versions it may: the one loaded for it, or with partial rollouts any from the
        oldest its step allows to the newest published."""
        versions = set(batch["policy_version"].tolist())
        if self._carry is None and versions != {version}:
            raise RuntimeError(f"rollout {index} was to be generated with policy version {version}, but its "
                               f"samples carry {sorted(versions)}: the weights did not reach the rollout group")
        if self._carry is not None and min(versions) < self._pipeline.target(index):
            raise RuntimeError(f"rollout {index} holds tokens of policy version {min(versions)}, older than the "
                               f"{self._pipeline.target(index)} its step allows: a carried conversation was not dropped")

    def _next_prompts(self) -> Batch:
        self._drawn += 1
        return next(self._prompts)

    def _send(self, version: int, keep_from: int) -> None:
        if self._transport == "broadcast":
            self.policy.publish_weights(version, self._dtype, keep_from)
            return
        self._refs[version] = self.policy.deferred("publish_weights", version, self._dtype)[0]  # rank 0's
        for old in [v for v in self._refs if v < keep_from and v != version]:
            del self._refs[old]

    def _load(self, version: int) -> None:
        if self._transport == "broadcast":
            self.rollout.receive_weights(version)
        else:
            self.rollout.load_weights(self._refs[version])

    def take(self, step: int, timing: dict[str, float]) -> tuple[Batch, dict[str, float]]:
        item, metrics = self._pipeline.take(step)
        for key, value in item.metrics.items():  # the production's own timing (gen, reward) and reward metrics
            if key.startswith("timing_s/"):
                timing[key] = timing.get(key, 0.0) + value
        return item.batch, {**{k: v for k, v in item.metrics.items() if not k.startswith("timing_s/")}, **metrics}

    def after_update(self, step: int, timing: dict[str, float]) -> dict[str, float]:
        """The trainer's weights are now version `step`: publish them to the rollout side."""
        started = time.perf_counter()
        self._pipeline.publish(step, self._send)
        timing["timing_s/publish"] = time.perf_counter() - started
        return {}

    @contextlib.contextmanager
    def checkpoint(self, step: int) -> Iterator[QueuedRollouts]:
        """The queue and producer state for a checkpoint at step `step`; the producer waits meanwhile."""
        queued, state = self._pipeline.pause(step)
        position = getattr(self._prompts, "position", None)
        pool = self._carry.pending() if self._carry is not None else []  # running conversations: restarted on resume
        try:
            yield QueuedRollouts({"async_rollout": {**state, "drawn": self._drawn,
                                                    "data_position": dict(position) if position else None},
                                  "data_position": None}, queued, pool)
        finally:
            self._pipeline.unpause()

    def close(self) -> None:
        if self._pipeline is not None:
            self._pipeline.close()
        if self._carry is not None:
            self._carry.close()
        if self._pipeline is not None and self._transport == "broadcast":
            with contextlib.suppress(Exception):  # the groups may be gone already (an error stopped the run)
                self.rollout.disconnect_weights()
                self.policy.stop_serving_weights()
        self._refs = {}


# ----------------------------------------------------------------------------- queued batches on disk
def write_rollouts(folder: Path, rollouts: list[Rollout]) -> None:
    """Each rollout as `<i>.pt` (tensors; read back with weights_only=True) and `<i>.json` (its index, version,
    metrics, the non-tensor columns and meta), so a checkpoint holds no pickled objects."""
    folder.mkdir(parents=True, exist_ok=True)
    for i, r in enumerate(rollouts):
        torch.save(dict(r.batch.tensors), folder / f"{i:04d}.pt")
        info = {"index": r.index, "version": r.version, "metrics": r.metrics, "meta": r.batch.meta,
                "non_tensors": {k: v.tolist() for k, v in r.batch.non_tensors.items()}}
        (folder / f"{i:04d}.json").write_text(json.dumps(info, default=_plain))


def read_rollouts(folder: Path) -> list[Rollout]:
    out = []
    for meta_file in sorted(folder.glob("*.json")):
        info = json.loads(meta_file.read_text())
        tensors = torch.load(meta_file.with_suffix(".pt"), weights_only=True)
        batch = Batch(tensors, info["non_tensors"], info["meta"])
        out.append(Rollout(info["index"], info["version"], batch, info["metrics"]))
    return out


def _plain(value: Any) -> Any:
    """numpy scalars and arrays inside non-tensor columns, as JSON has them."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"a rollout column holds a {type(value).__name__}, which a checkpoint cannot store as JSON")
