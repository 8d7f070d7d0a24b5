"""RayRuntime: one Ray actor per worker, placement groups per resource pool, torch.distributed per group.

Each actor sets the torch.distributed environment of its group (rank, world size, a free
master port chosen by the driver; gloo on CPU, NCCL on GPU through Accelerate) and then
builds its worker from the Plan's fiddle JSON. Groups colocated with another group share
that group's bundles. `address=None` starts a local cluster, `address="auto"` joins one.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
from collections.abc import Sequence
from typing import Any

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from rlhf.runtime.group import WorkerGroup
from rlhf.runtime.plan import GroupSpec, Plan
from rlhf.ranges import NonNegativeInt, PositiveInt


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _WorkerActor:
    """Hosts one worker; the group's torch.distributed env is set before the worker is built."""

    def __init__(self, worker_json: str, env: dict[str, str], num_threads: int, cwd: str):
        os.environ.update(env)
        os.chdir(cwd)  # relative paths in the graph mean the same as in the driver
        import torch

        torch.set_num_threads(num_threads)
        import fiddle as fdl

        from rlhf.graph.io import from_json

        self.worker = fdl.build(from_json(worker_json))

    def call(self, method: str, args: tuple, kwargs: dict) -> Any:
        return getattr(self.worker, method)(*args, **kwargs)


class RayWorkerGroup(WorkerGroup):
    def __init__(self, spec: GroupSpec, pg: Any, bundle_offset: int, share_bundles: bool):
        super().__init__(spec, world_size=spec.num_workers)
        addr, port = "127.0.0.1", free_port()
        actor_cls = ray.remote(_WorkerActor)
        threads = max(1, int(spec.cpus_per_worker))
        self.actors = []
        for rank in range(spec.num_workers):
            env = {
                "MASTER_ADDR": addr,
                "MASTER_PORT": str(port),
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "WORLD_SIZE": str(spec.num_workers),
                "LOCAL_WORLD_SIZE": str(spec.num_workers),
                "OMP_NUM_THREADS": str(threads),
            }
            options = dict(
                num_cpus=0 if share_bundles else spec.cpus_per_worker,
                num_gpus=spec.gpus_per_worker,
                name=f"{spec.name}-{rank}-{port}",
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=pg, placement_group_bundle_index=bundle_offset + rank
                ),
            )
            self.actors.append(actor_cls.options(**options).remote(spec.worker_json, env, threads, os.getcwd()))
        ray.get([a.__ray_ready__.remote() for a in self.actors])

    def _run(self, method: str, per_rank: Sequence[tuple[tuple, dict]]) -> list[Any]:
        refs = [a.call.remote(method, args, kwargs) for a, (args, kwargs) in zip(self.actors, per_rank)]
        return ray.get(refs)

    def shutdown(self) -> None:
        for a in self.actors:
            ray.kill(a)
        self.actors = []


class RayRuntime:
    """Runs a Plan's worker groups as Ray actors (the driver stays in this process)."""

    def __init__(
        self,
        address: str | None = None,  # None: start a local cluster; "auto": join a running one
        num_cpus: PositiveInt | None = None,  # CPUs of a local cluster; None: enough for the plan
        num_gpus: NonNegativeInt | None = None,
        inline_bytes: NonNegativeInt = 4 * 2**20,  # a local cluster passes call arguments/results up to this size inline
    ):
        self.address = address
        self.inline_bytes = inline_bytes
        self.num_cpus = num_cpus
        self.num_gpus = num_gpus
        self._pgs: list[Any] = []
        self._groups: list[RayWorkerGroup] = []
        self._connected = False  # whether this runtime called ray.init (and so must call ray.shutdown)

    def _init(self, plan: Plan) -> None:
        if ray.is_initialized():
            return  # someone else's connection: they shut it down
        needed = sum(g.cpus_per_worker * g.num_workers for g in plan.groups.values() if not g.colocate_with)
        # address None means a new local cluster: Ray's own None joins any cluster already running
        # on this machine (/tmp/ray/ray_current_cluster), e.g. another user's or another test's.
        address = "local" if self.address is None else self.address
        kwargs: dict[str, Any] = dict(address=address, include_dashboard=False, log_to_driver=True)
        if self.address is None:
            kwargs["num_cpus"] = self.num_cpus or max(os.cpu_count() or 1, int(needed + 0.999))
            kwargs["num_gpus"] = self.num_gpus
            # Ray's default (100 KB) sends a GRPO batch through the shared-memory object store,
            # which made a call with a 158 KB batch cost 6.3 ms on a small machine against 3.7 ms inline
            # (benchmarks/ray_dispatch.py). Only a cluster started here can be configured.
            kwargs["_system_config"] = {
                "max_direct_call_object_size": self.inline_bytes,
                "task_rpc_inlined_bytes_limit": max(self.inline_bytes * 4, 10 * 2**20),
            }
        pythonpath = os.pathsep.join([os.getcwd(), *[p for p in sys.path if p]])
        kwargs["runtime_env"] = {
            "env_vars": {"PYTHONPATH": pythonpath, "TOKENIZERS_PARALLELISM": "false", "RAY_DEDUP_LOGS": "0"}
        }
        handler = signal.getsignal(signal.SIGTERM)
        ray.init(**kwargs)
        self._connected = True
        if callable(handler) and threading.current_thread() is threading.main_thread():
            # ray.init installs a native SIGTERM handler that aborts the process (exit -6) with no
            # clean-up; the driver's own handler (the experiment runner's) must stay in charge.
            signal.signal(signal.SIGTERM, handler)

    def start_groups(self, plan: Plan) -> dict[str, WorkerGroup]:
        self._init(plan)
        pools: dict[str, Any] = {}
        groups: dict[str, WorkerGroup] = {}
        # Owners of a pool first, so colocated groups find their bundles.
        for spec in sorted(plan.groups.values(), key=lambda g: g.colocate_with is not None):
            if spec.pool not in pools:
                bundle = {"CPU": spec.cpus_per_worker}
                if spec.gpus_per_worker:
                    bundle["GPU"] = spec.gpus_per_worker
                pg = placement_group([dict(bundle) for _ in range(spec.num_workers)], strategy="PACK")
                ray.get(pg.ready(), timeout=120)
                pools[spec.pool] = pg
                self._pgs.append(pg)
            groups[spec.name] = RayWorkerGroup(spec, pools[spec.pool], 0, share_bundles=spec.colocate_with is not None)
            self._groups.append(groups[spec.name])
        return groups

    def stop_groups(self) -> None:
        for g in self._groups:
            g.shutdown()
        for pg in self._pgs:
            remove_placement_group(pg)
        self._groups, self._pgs = [], []

    def shutdown(self) -> None:
        """Stop the groups, then disconnect; a local cluster this runtime started (GCS, raylet,
        workers) stops with it. The experiment runner calls this on every exit: normal, an
        exception, Ctrl-C, SIGTERM (`rlhf.runtime.experiment.terminate_as_interrupt`)."""
        try:
            self.stop_groups()
        finally:
            if self._connected and ray.is_initialized():
                ray.shutdown()
            self._connected = False

    def describe(self) -> str:
        return f"RayRuntime(address={self.address!r})"
