"""RayRuntime: one Ray actor per worker, placement groups per resource pool, torch.distributed per group.

Start-up of a group: its actors are placed in their pool's bundles (colocated groups share
the owner's bundles and split its GPU, `rlhf.runtime.placement`), each reports its node, and
rank 0 a free port on its node; then each gets its torch.distributed env (`MASTER_ADDR` of
rank 0's node, `LOCAL_RANK` per node: `rlhf.runtime.dist_env`; gloo on CPU, NCCL on GPU
through Accelerate) and builds its worker from the Plan's fiddle JSON. A plan the cluster
cannot hold is refused before anything starts; one it does not place in `ready_timeout_s`
raises an error naming the group. `address=None` starts a local cluster, `address="auto"`
joins one (docs/runtime.md).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import sys
import threading
import uuid
from collections.abc import Sequence
from typing import Any

try:  # optional where only LocalRuntime runs (a bare GPU machine): RayRuntime says so when it starts
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
except ImportError as _missing:
    ray = None
    _RAY_MISSING = _missing

from rlhf.runtime.dist_env import ActorSite, distributed_env
from rlhf.runtime.group import WorkerGroup
from rlhf.runtime.placement import (
    Placement,
    PlacementError,
    cluster_problems,
    format_resources,
    placements,
    pool_members,
)
from rlhf.runtime.plan import GroupSpec, Plan
from rlhf.ranges import NonNegativeInt, PositiveFloat, PositiveInt


def free_port() -> int:
    """A port free on this machine now (bound to every interface, as the TCPStore binds)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


class _WorkerActor:
    """Hosts one worker. Started empty, so it can report where Ray put it (`site`) before the
    group's torch.distributed env, which depends on that, is set and the worker is built (`build`)."""

    def __init__(self, num_threads: int, cwd: str):
        os.environ["OMP_NUM_THREADS"] = str(num_threads)  # before torch loads its OpenMP runtime
        if not os.path.isdir(cwd):
            raise FileNotFoundError(
                f"the driver's working directory {cwd} does not exist on node {ray.util.get_node_ip_address()}: "
                "every node of the cluster needs the code, models and data at the driver's paths (docs/runtime.md)"
            )
        os.chdir(cwd)  # relative paths in the graph mean the same as in the driver
        import torch

        torch.set_num_threads(num_threads)
        self.worker = None

    def site(self, with_port: bool) -> ActorSite:
        context = ray.get_runtime_context()
        return ActorSite(
            node_id=context.get_node_id(),
            node_ip=ray.util.get_node_ip_address(),
            gpu_ids=tuple(str(i) for i in context.get_accelerator_ids().get("GPU", [])),
            port=free_port() if with_port else None,
        )

    def build(self, worker_json: str, env: dict[str, str]) -> None:
        os.environ.update(env)
        import fiddle as fdl

        from rlhf.graph.io import from_json

        self.worker = fdl.build(from_json(worker_json))

    def call(self, method: str, args: tuple, kwargs: dict) -> Any:
        # another group's deferred result (WorkerGroup.deferred) arrives as a reference: read it here,
        # from the object store, not through the driver
        args = tuple(ray.get(a) if isinstance(a, ray.ObjectRef) else a for a in args)
        return getattr(self.worker, method)(*args, **kwargs)


class RayWorkerGroup(WorkerGroup):
    """One actor per rank, placed in its pool's bundle of the same index.

    Start-up has two phases: placement (actors scheduled and reporting their node; bounded by
    `ready_timeout_s`, since an actor Ray cannot place would otherwise wait forever) and build
    (each worker loads its models; unbounded, it may take long for a large model).
    """

    def __init__(self, spec: GroupSpec, pg: Any, placement: Placement, ready_timeout_s: float):
        super().__init__(spec, world_size=spec.num_workers)
        actor_cls = ray.remote(_WorkerActor)
        threads = max(1, int(spec.cpus_per_worker))
        self.actors = []
        tag = uuid.uuid4().hex[:8]
        for rank in range(spec.num_workers):
            options = dict(
                num_cpus=placement.num_cpus,
                num_gpus=placement.num_gpus,
                name=f"{spec.name}-{rank}-{tag}",
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=pg, placement_group_bundle_index=rank
                ),
            )
            self.actors.append(actor_cls.options(**options).remote(threads, os.getcwd()))
        refs = [a.site.remote(rank == 0) for rank, a in enumerate(self.actors)]
        try:
            try:
                sites = ray.get(refs, timeout=ready_timeout_s)
            except ray.exceptions.GetTimeoutError:
                raise PlacementError(
                    f"group {spec.name!r}: its {spec.num_workers} actors ({placement.describe()}) were not all "
                    f"started within {ready_timeout_s:g} s. {_cluster_state()} Free the resources another job holds, "
                    f"add nodes, or lower num_workers/cpus_per_worker/gpus_per_worker; if the actors were placed but "
                    f"their processes are slow to start, see the Ray logs (/tmp/ray/session_latest/logs) or raise "
                    f"RayRuntime(ready_timeout_s=...)."
                ) from None
            envs = distributed_env(sites)
            ray.get([a.build.remote(spec.worker_json, env) for a, env in zip(self.actors, envs)])
        except BaseException:
            self.shutdown()  # the runtime never saw this group: release its actors here
            raise

    def _run(self, method: str, per_rank: Sequence[tuple[tuple, dict]]) -> list[Any]:
        try:
            return ray.get(self._submit(method, per_rank))
        except ray.exceptions.RayActorError as err:  # its text is Ray's multi-line dump, or nothing at all
            raise WorkerDiedError(_died_message(self, method, err)) from err

    def _submit(self, method: str, per_rank: Sequence[tuple[tuple, dict]]) -> list[Any]:
        return [a.call.remote(method, args, kwargs) for a, (args, kwargs) in zip(self.actors, per_rank)]

    def shutdown(self) -> None:
        for a in self.actors:
            ray.kill(a)
        self.actors = []


class WorkerDiedError(RuntimeError):
    """A worker's process died (killed, out of memory, a crash in native code); names it and its log."""


def _died_message(group: RayWorkerGroup, method: str, err: Any) -> str:
    """Which rank of `group` died during `method`, and where its output and the likely cause are."""
    ranks = [r for r, a in enumerate(group.actors) if a._actor_id.hex() == getattr(err, "actor_id", None)]
    rank = f"rank {ranks[0]} of {group.world_size}" if ranks else f"a worker (of {group.world_size})"
    text = str(getattr(err, "error_msg", "") or err)
    pid, ip = re.search(r"\bpid: (\d+)", text), re.search(r"\bip: (\S+)", text)
    where = f" (pid {pid.group(1)}{f' on {ip.group(1)}' if ip else ''})" if pid else ""
    logs = _logs_dir()
    files = f"{logs}/worker-*-{pid.group(1)}.err and .out" if pid else f"the worker-*.err files in {logs}"
    return (f"worker group {group.name!r}: {rank}{where} died during {method}(). Its output is in {files}. A "
            f"worker that dies without a Python error was most often killed for running out of memory: see "
            f"raylet.out in the same folder (Ray's memory monitor) and `dmesg` (the kernel's OOM killer).")


def _logs_dir() -> str:
    """This Ray session's log folder (the default one where Ray does not say)."""
    try:
        return ray._private.worker._global_node.get_logs_dir_path()
    except Exception:  # a private API: its absence must not hide the error being reported
        return "/tmp/ray/session_latest/logs"


def _cluster_state() -> str:
    def fmt(resources: dict) -> str:
        return "{" + ", ".join(f"{k}: {resources.get(k, 0):g}" for k in ("CPU", "GPU")) + "}"

    return f"The cluster has {fmt(ray.available_resources())} available of {fmt(ray.cluster_resources())}."


class RayRuntime:
    """Runs a Plan's worker groups as Ray actors (the driver stays in this process)."""

    def __init__(
        self,
        address: str | None = None,  # None: start a local cluster; "auto": join a running one
        num_cpus: PositiveInt | None = None,  # CPUs of a local cluster; None: enough for the plan
        num_gpus: NonNegativeInt | None = None,  # GPUs of a local cluster (logical ones schedule on a CPU machine)
        inline_bytes: NonNegativeInt = 4 * 2**20,  # a local cluster passes call arguments/results up to this size inline
        ready_timeout_s: PositiveFloat = 300.0,  # wait this long for placement groups and actors to be placed, then raise
        autoscaling: bool = False,  # the cluster adds nodes on demand: do not refuse a plan its nodes cannot hold now
        worker_niceness: int = 0,  # workers run this much nicer than their raylet (Ray's own default: 15)
    ):
        self.address = address
        self.ready_timeout_s = ready_timeout_s
        self.autoscaling = autoscaling
        self.inline_bytes = inline_bytes
        self.num_cpus = num_cpus
        self.num_gpus = num_gpus
        self.worker_niceness = worker_niceness
        self._pgs: list[Any] = []
        self._groups: list[RayWorkerGroup] = []
        self._connected = False  # whether this runtime called ray.init (and so must call ray.shutdown)
        self._owns_cluster = False  # whether that call started a local cluster (which goes with ray.shutdown)

    def _init(self, plan: Plan) -> None:
        if ray is None:
            raise ImportError(
                f"RayRuntime needs Ray, which is not importable here ({_RAY_MISSING}): install it "
                "(`pip install ray`), or run in-process with `--config fiddler:local` (LocalRuntime)."
            )
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
        # Ray renices every worker process by 15 unless told otherwise (its job supervisor tells its own 0); but the
        # workers do the run's work: at nice 15 the driver and any other process on their cores outweigh them (one
        # at nice 19 takes 30% of a shared core). By default they run at their raylet's priority (docs/runtime.md).
        kwargs["runtime_env"] = {
            "env_vars": {"PYTHONPATH": pythonpath, "TOKENIZERS_PARALLELISM": "false", "RAY_DEDUP_LOGS": "0",
                         "RAY_worker_niceness": str(self.worker_niceness)}
        }
        handler = signal.getsignal(signal.SIGTERM)
        ray.init(**kwargs)
        self._connected = True
        self._owns_cluster = self.address is None
        if callable(handler) and threading.current_thread() is threading.main_thread():
            # ray.init installs a native SIGTERM handler that aborts the process (exit -6) with no
            # clean-up; the driver's own handler (the experiment runner's) must stay in charge.
            signal.signal(signal.SIGTERM, handler)

    def start_groups(self, plan: Plan) -> dict[str, WorkerGroup]:
        """Check the plan against the cluster's nodes, then reserve each pool's bundles and start
        its groups (owners first, colocated groups in the owners' bundles). Raises
        `PlacementError` before anything starts when the cluster cannot hold the plan, and after
        `ready_timeout_s` when it could but does not place it (another job holds the resources)."""
        self._init(plan)
        nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
        problems = [] if self.autoscaling else cluster_problems(plan.groups, nodes)
        if problems:
            raise PlacementError(
                "the plan cannot be placed on this Ray cluster (on an autoscaling cluster pass "
                "RayRuntime(autoscaling=True)):\n" + "\n".join(f"- {p}" for p in problems)
            )
        where = placements(plan.groups)
        groups: dict[str, WorkerGroup] = {}
        for pool, members in pool_members(plan.groups).items():
            owner = members[0]
            bundle = where[owner.name].bundle
            pg = placement_group([dict(bundle) for _ in range(owner.num_workers)], strategy="PACK")
            self._pgs.append(pg)  # removed by stop_groups even if it never becomes ready
            try:
                ray.get(pg.ready(), timeout=self.ready_timeout_s)
            except ray.exceptions.GetTimeoutError:
                names = ", ".join(repr(m.name) for m in members)
                raise PlacementError(
                    f"group {owner.name!r}: its placement group ({owner.num_workers} bundles of "
                    f"{format_resources(bundle)}, for {names}) was not "
                    f"ready within {self.ready_timeout_s:g} s. {_cluster_state()} Free the resources another job "
                    f"holds, add nodes, or lower num_workers/cpus_per_worker/gpus_per_worker; on an autoscaling "
                    f"cluster raise RayRuntime(ready_timeout_s=...)."
                ) from None
            for spec in members:
                groups[spec.name] = RayWorkerGroup(spec, pg, where[spec.name], self.ready_timeout_s)
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
        exception, Ctrl-C, SIGTERM (`rlhf.runtime.experiment.terminate_as_interrupt`).

        A local cluster of its own is shut down whole, without asking it to stop each group first:
        its actors and placement groups end with it, and a Ctrl-C or `timeout` signals the whole
        process group, so its GCS may already be gone. Asking a dead GCS to remove a placement
        group blocks until Ray gives up on it (60 s, "Failed to connect to GCS"), then exits the
        driver before its Aim runs are closed."""
        try:
            if self._owns_cluster:
                self._groups, self._pgs = [], []
            else:
                self.stop_groups()
        finally:
            if self._connected and ray.is_initialized():
                ray.shutdown()
            self._connected = self._owns_cluster = False

    def describe(self) -> str:
        return f"RayRuntime(address={self.address!r})"
