"""The policy's weights, carried to a rollout group in other processes (asynchronous rollout, docs/async.md).

A trainer that rolls out on a separate group (`rlhf.workers.rollout.RolloutWorker`) publishes a
*snapshot* of its weights after each update: every weight, cast to the rollout engine's dtype and
packed into one flat buffer (`WeightSnapshot`), tagged with the policy version (the number of
updates behind it). Under FSDP every rank takes part in gathering the full tensors; rank 0 holds
the snapshot. Two transports carry it, chosen by the driver (`rlhf.trainers.async_rollout`):

- **object store**: the snapshot is the result of `publish_weights` and stays where the runtime keeps
  results (Ray's object store; in-process, the object itself); each rollout rank loads it from there.
- **broadcast**: a torch.distributed group of its own between policy rank 0 and every rollout rank
  (gloo on CPU, NCCL on GPU), outside the groups' own process groups. Rank 0 keeps the snapshots a
  rollout rank may still ask for; a thread serves each request (a key in the group's TCP store)
  with one broadcast of the flat buffer, so the trainer never waits for the rollout side.

The flat buffer is one tensor on purpose: one collective (or one object) per sync instead of one
per parameter, and a layout (names, shapes) that the receivers learn once.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
import threading
import warnings
from collections.abc import Iterable, Iterator

import torch
import torch.distributed as dist

from rlhf.workers.dispatch import on_all_ranks
from rlhf.workers.precision import DType

NamedTensors = Iterable[tuple[str, torch.Tensor]]
STORE_TIMEOUT = datetime.timedelta(days=1)  # a rollout side may be idle for long (a trainer's evaluation, checkpoint)
COLLECTIVE_TIMEOUT = datetime.timedelta(minutes=30)  # one broadcast, both sides already in it


@dataclasses.dataclass(frozen=True)
class WeightLayout:
    """Where each named weight lies in a flat buffer of one dtype."""

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    dtype: DType

    @property
    def numel(self) -> int:
        return sum(math.prod(s) for s in self.shapes)

    def unflatten(self, flat: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
        """(name, view into `flat`) per weight, in order."""
        offset = 0
        for name, shape in zip(self.names, self.shapes):
            n = math.prod(shape)
            yield name, flat[offset: offset + n].view(shape)
            offset += n


@dataclasses.dataclass
class WeightSnapshot:
    """A policy version's weights: `flat` (1-D, the layout's dtype) laid out by `layout`."""

    version: int
    layout: WeightLayout
    flat: torch.Tensor

    def named(self) -> Iterator[tuple[str, torch.Tensor]]:
        return self.layout.unflatten(self.flat)

    def __reduce__(self):
        # a flat uint8 numpy view crosses Ray's object store without a copy on the reading side
        # (numpy buffers are zero-copy there, torch tensors are not); bf16 has no numpy dtype
        raw = self.flat.detach().cpu().contiguous().view(torch.uint8).numpy()
        return _rebuild_snapshot, (self.version, self.layout, raw)


def _rebuild_snapshot(version: int, layout: WeightLayout, raw) -> WeightSnapshot:
    if not len(raw):
        return WeightSnapshot(version, layout, torch.empty(0, dtype=getattr(torch, layout.dtype)))
    with warnings.catch_warnings():  # read-only shared memory under Ray: the snapshot is only read (copied from)
        warnings.filterwarnings("ignore", message="The given buffer is not writable")
        flat = torch.frombuffer(raw, dtype=torch.uint8)
    return WeightSnapshot(version, layout, flat.view(getattr(torch, layout.dtype)))


def snapshot(weights: NamedTensors, version: int, dtype: DType, device: torch.device | str,
             keep: bool = True) -> WeightSnapshot | None:
    """Pack `weights` (full tensors, streamed) into one flat buffer of `dtype` on `device`.

    Every rank of an FSDP group must iterate `weights` (each full tensor is a collective); ranks
    with `keep=False` consume the stream and return None.
    """
    names, shapes, parts = [], [], []
    for name, tensor in weights:
        if keep:
            names.append(name)
            shapes.append(tuple(tensor.shape))
            parts.append(tensor.detach().to(device=device, dtype=getattr(torch, dtype)).reshape(-1))
    if not keep:
        return None
    flat = torch.cat(parts) if parts else torch.empty(0, dtype=getattr(torch, dtype), device=device)
    return WeightSnapshot(version, WeightLayout(tuple(names), tuple(shapes), dtype), flat)


def _backend(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def _process_group(store: dist.Store, rank: int, size: int, device: torch.device) -> dist.ProcessGroup:
    """A process group of its own over `store` (never the default one: the trainer's FSDP/DDP group)."""
    if device.type == "cuda":
        return dist.ProcessGroupNCCL(store, rank, size)  # GPU path: written for NCCL, not run on this project's CI
    return dist.ProcessGroupGloo(store, rank, size, COLLECTIVE_TIMEOUT)


def _reachable_host() -> str:
    """This process's address as other ranks reach it: the group's MASTER_ADDR (the runtime sets it to
    rank 0's node, and the sender is rank 0), else this machine."""
    return os.environ.get("MASTER_ADDR") or "127.0.0.1"


class BroadcastSender:
    """Policy rank 0's end of the broadcast transport: keeps snapshots, serves requests in a thread.

    Group ranks: 0 is this sender, 1..n the rollout ranks. A request is the store key
    `request/<i>` (i = 0, 1, ...) holding the version wanted; the answer is one broadcast of that
    version's flat buffer from rank 0. Versions are kept until `publish(..., keep_from=)` drops them.
    """

    def __init__(self, receivers: int, device: torch.device):
        self.device = device
        self.store = dist.TCPStore(_reachable_host(), 0, None, True, timeout=STORE_TIMEOUT, wait_for_workers=False)
        self.address = (_reachable_host(), int(self.store.port))
        self.size = receivers + 1
        self._snapshots: dict[int, WeightSnapshot] = {}
        self._changed = threading.Condition()
        self._next_request = 0
        self._stopping = False
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._serve, name="weight-sender", daemon=True)
        self._thread.start()

    def publish(self, snap: WeightSnapshot, keep_from: int) -> None:
        """Offer `snap`; drop kept versions below `keep_from` (no rollout rank will ask for them)."""
        if self.error is not None:
            raise RuntimeError(f"the weight sender stopped: {self.error!r}") from self.error
        if snap.flat.is_cuda:
            torch.cuda.current_stream().synchronize()  # the serving thread reads it on another stream
        with self._changed:
            if not self._snapshots:
                self.store.set("layout", json.dumps(dataclasses.asdict(snap.layout)))  # the receivers' first read
            self._snapshots[snap.version] = snap
            for v in [v for v in self._snapshots if v < keep_from and v != snap.version]:
                del self._snapshots[v]
            self._changed.notify_all()

    def _serve(self) -> None:
        try:
            if self.device.type == "cuda":
                torch.cuda.set_device(self.device)
            # a client of its own: one TCPStore connection cannot wait and set from two threads at once
            store = dist.TCPStore(*self.address, None, False, timeout=STORE_TIMEOUT)
            group = _process_group(store, 0, self.size, self.device)
            while True:
                key = f"request/{self._next_request}"
                store.wait([key], STORE_TIMEOUT)
                version = int(store.get(key))
                self._next_request += 1
                if version < 0 or self._stopping:
                    return
                with self._changed:
                    self._changed.wait_for(lambda: version in self._snapshots or self._stopping)
                    if self._stopping:
                        return
                    flat = self._snapshots[version].flat
                group.broadcast(flat, 0).wait()
        except BaseException as err:  # noqa: BLE001 - reported by the next publish
            self.error = err

    def close(self) -> None:
        self._stopping = True
        with self._changed:
            self._changed.notify_all()
        self.store.set(f"request/{self._next_request}", "-1")  # wakes the thread if it waits for a request
        self._thread.join(timeout=10)


class BroadcastReceiver:
    """A rollout rank's end of the broadcast transport (rank 1 + its rollout rank)."""

    def __init__(self, address: tuple[str, int], rank: int, receivers: int, device: torch.device):
        host, port = address
        self.rank = rank
        self.device = device
        self.store = dist.TCPStore(host, port, None, False, timeout=STORE_TIMEOUT)
        self.group = _process_group(self.store, rank + 1, receivers + 1, device)
        self._requests = 0
        self._layout: WeightLayout | None = None
        self._flat: torch.Tensor | None = None

    def receive(self, version: int) -> WeightSnapshot:
        """The snapshot of `version` (every rollout rank calls this at once; rank 0 asks)."""
        if self._layout is None:
            fields = json.loads(self.store.get("layout"))
            self._layout = WeightLayout(tuple(fields["names"]), tuple(tuple(s) for s in fields["shapes"]), fields["dtype"])
            self._flat = torch.empty(self._layout.numel, dtype=getattr(torch, self._layout.dtype), device=self.device)
        if self.rank == 0:
            self.store.set(f"request/{self._requests}", str(version))
        self._requests += 1
        self.group.broadcast(self._flat, 0).wait()
        return WeightSnapshot(version, self._layout, self._flat)

    def close(self) -> None:
        if self.rank == 0:
            self.store.set(f"request/{self._requests}", "-1")


class PublishesWeights:
    """Mixed into a worker that trains the policy, so a rollout group can follow its weights.

    The worker provides `_rollout_weights()` (its full weights by Hugging Face name, streamed; a
    collective under FSDP), `_is_main_rank()` and `_weights_device()`.
    """

    _weight_sender: BroadcastSender | None = None

    def _rollout_weights(self) -> NamedTensors:
        raise NotImplementedError

    def _is_main_rank(self) -> bool:
        raise NotImplementedError

    def _weights_device(self) -> torch.device:
        raise NotImplementedError

    @on_all_ranks
    def publish_weights(self, version: int, dtype: DType, keep_from: int | None = None) -> WeightSnapshot | None:
        """Snapshot the weights as policy `version` (every rank takes part; rank 0 holds it).

        Object-store transport (`keep_from` None): rank 0 returns the snapshot, the other ranks None.
        Broadcast transport: rank 0 hands it to its sender (`serve_weights` first), which drops the
        versions below `keep_from`; every rank returns None.
        """
        broadcast = keep_from is not None
        device = self._weights_device() if broadcast else torch.device("cpu")
        snap = snapshot(self._rollout_weights(), version, dtype, device, keep=self._is_main_rank())
        if not broadcast or snap is None:
            return snap
        if self._weight_sender is None:
            raise RuntimeError("publish_weights(keep_from=...) uses the broadcast transport: call serve_weights first")
        self._weight_sender.publish(snap, keep_from)
        return None

    @on_all_ranks
    def serve_weights(self, receivers: int) -> tuple[str, int] | None:
        """Start the broadcast transport's sender on rank 0 for `receivers` rollout ranks; its (host, port)."""
        if not self._is_main_rank():
            return None
        self.stop_serving_weights()
        self._weight_sender = BroadcastSender(receivers, self._weights_device())
        return self._weight_sender.address

    @on_all_ranks
    def stop_serving_weights(self) -> None:
        if self._weight_sender is not None:
            self._weight_sender.close()
            self._weight_sender = None
