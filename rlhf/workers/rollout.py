"""The rollout worker: a rollout engine in a group of its own, following the trainer's weights a few versions behind.

Asynchronous rollout (docs/async.md) generates batch k+1 while the trainer updates on batch k, so the
engine cannot share the actor's module as the policy worker's hybrid engine does: it holds its own copy
(built from the model folder like every engine, `rlhf.rollout.engine`), and the trainer's weights reach
it as versioned snapshots (`rlhf.workers.weight_sync`): loaded from where the runtime keeps results
(`load_weights`, the object-store transport) or received by broadcast (`receive_weights`). Every sample
it returns carries `policy_version` (B,): the number of updates behind the weights that sampled it.

Time-sliced with the policy on one device (colocated groups), the driver puts the engine to sleep after
each rollout; an engine that drops its weights while asleep (vLLM, level 2) gets the last snapshot back
before the next one.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

import torch

from rlhf.batch import Batch
from rlhf.models.loading import causal_lm_source, resolve_model_path
from rlhf.rollout.engine import EngineFactory
from rlhf.rollout.hf_engine import HFEngine
from rlhf.rollout.sampling import SamplingParams
from rlhf.signatures import with_defaults
from rlhf.workers.dispatch import on_all_ranks, shard
from rlhf.workers.fsdp import source_parameter_bytes
from rlhf.workers.precision import DType
from rlhf.workers.weight_sync import BroadcastReceiver, WeightSnapshot

RANK_SEED_STRIDE = 1_000_003  # rank r samples from seed + r * stride: ranks never share a random stream


def fdl_callable(factory) -> object:
    """The class behind an engine factory as the plan sees it: a class, a functools.partial, or an unbuilt
    fdl.Partial (read by attribute, so this module needs no fiddle)."""
    for attribute in ("__fn_or_cls__", "func"):
        factory = getattr(factory, attribute, factory)
    return factory


@dataclasses.dataclass(frozen=True)
class RolloutPlan:
    """A rollout rank's engine, resolved once from its arguments (`plan_rollout`): read by the constructor
    and the plan line alike."""

    model_path: Any
    engine: EngineFactory  # built from model_path: always its own copy of the weights
    dtype: str  # the copy's storage; the worker's own setting wins over one on the engine's node

    @property
    def engine_name(self) -> str:
        return getattr(fdl_callable(self.engine), "__name__", str(self.engine))


def plan_rollout(*, model_path: Any, engine: EngineFactory, dtype: str) -> RolloutPlan:
    """The plan of a `RolloutWorker` built with these arguments."""
    return RolloutPlan(model_path, engine, dtype)


class RolloutWorker:
    """Generates on one rank with its own engine; tags samples with the weights' policy version."""

    def __init__(
        self,
        model_path: str,
        engine: EngineFactory = HFEngine,  # HFEngine or fdl.Partial(VLLMEngine, ...): built from model_path
        dtype: DType = "float32",  # storage of the engine's weights (snapshots arrive in it)
    ):
        self.plan = plan_rollout(model_path=model_path, engine=engine, dtype=dtype)
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.dtype = self.plan.dtype
        self.engine = engine(model_path, dtype=self.plan.dtype, device=self.device)
        self.rank = int(os.environ.get("RANK", "0"))
        self.version = 0  # the weights of model_path: the trainer's version 0
        self._receiver: BroadcastReceiver | None = None
        self._kept: WeightSnapshot | None = None  # for an engine that forgets its weights in sleep
        self._asleep = False

    @classmethod
    def resolve_plan(cls, arguments: Mapping[str, Any]) -> RolloutPlan:
        """The plan of a worker built with `arguments` (the signature's defaults fill the rest)."""
        return plan_rollout(**with_defaults(cls, arguments))

    @classmethod
    def preflight(cls, arguments: dict) -> None:
        plan = cls.resolve_plan(arguments)
        if isinstance(plan.model_path, str):
            resolve_model_path(plan.model_path)

    @classmethod
    def describe_placement(cls, arguments: dict, world_size: int, on_gpu: bool) -> str:
        """The plan's line for this group: the engine and the bytes of its own copy of the weights per rank."""
        plan = cls.resolve_plan(arguments)
        try:
            size = f"{source_parameter_bytes(causal_lm_source(plan.model_path, plan.dtype).skeleton) / 2**20:.3f} MB"
        except (OSError, TypeError, ValueError):  # a model an earlier stage makes: not written yet
            size = "size known when the stage starts"
        return f"rollout engine {plan.engine_name} ({plan.dtype}), its own copy of the weights on every rank: {size}"

    # ------------------------------------------------------------- rollout
    @shard
    def generate(self, prompts: Batch, sampling: SamplingParams, seed: int) -> Batch:
        """`sampling.n` responses per prompt with the engine's log-probs and `policy_version` (B,).

        `seed`: the rollout's seed (the driver derives it from the run's seed and the rollout's index),
        so a rollout is the same whatever ran before it (exact resume); each rank offsets it.
        """
        self._wake()
        out = self.engine.generate(prompts.to(self.device), sampling, seed=seed + self.rank * RANK_SEED_STRIDE)
        out = out.to("cpu")
        out["policy_version"] = torch.full((len(out),), self.version, dtype=torch.int64)
        return out

    @on_all_ranks
    def sleep(self) -> None:
        """Free the engine's device memory until the next rollout (time-sliced with the trainer)."""
        self.engine.sleep()
        self._asleep = True

    def _wake(self) -> None:
        if not self._asleep:
            return
        forgets = getattr(self.engine, "sleep_mode", False)  # vLLM's level-2 sleep drops the weights
        self.engine.wake_up(["weights"])
        if forgets and self._kept is not None:
            self.engine.update_weights(self._kept.named())
        self.engine.wake_up(["kv_cache"])
        self._asleep = False

    # ------------------------------------------------------------- weights
    @on_all_ranks
    def weights_dtype(self) -> DType:
        """The dtype snapshots must come in (the engine's own)."""
        return self.dtype

    @on_all_ranks
    def policy_version(self) -> int:
        return self.version

    @on_all_ranks
    def load_weights(self, snap: WeightSnapshot) -> None:
        """Take a snapshot from the object-store transport (every rank loads the same one)."""
        self._load(snap)

    @on_all_ranks
    def connect_weights(self, address: tuple[str, int], receivers: int) -> None:
        """Join the broadcast transport of the policy's rank 0 at `address` (every rollout rank at once)."""
        self._receiver = BroadcastReceiver(tuple(address), self.rank, receivers, self.device)

    @on_all_ranks
    def receive_weights(self, version: int) -> None:
        """Receive `version` by broadcast (every rollout rank at once) and load it."""
        if self._receiver is None:
            raise RuntimeError("receive_weights needs connect_weights first (the broadcast transport)")
        self._load(self._receiver.receive(version))

    @on_all_ranks
    def disconnect_weights(self) -> None:
        if self._receiver is not None:
            self._receiver.close()
            self._receiver = None

    def _load(self, snap: WeightSnapshot) -> None:
        if snap.layout.dtype != self.dtype:
            raise ValueError(f"RolloutWorker: a snapshot in {snap.layout.dtype} for an engine in {self.dtype}; "
                             "publish in the engine's dtype (weights_dtype)")
        self._wake()
        self.engine.update_weights(snap.named())
        self.version = snap.version
        if getattr(self.engine, "sleep_mode", False):  # keep a host copy to restore after a level-2 sleep
            self._kept = WeightSnapshot(snap.version, snap.layout, snap.flat.to("cpu", copy=True))
