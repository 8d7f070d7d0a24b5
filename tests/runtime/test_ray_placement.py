"""RayRuntime on a two-node Ray cluster (two raylets on this machine, `ray.cluster_utils.Cluster`),
each node with 1 CPU and 1 logical GPU (Ray schedules it; nothing here touches CUDA).

The plan is the colocated-critic case that used to hang: a 2-rank policy asking 1 GPU per worker
and a critic colocated with it asking the same. Before the fix the critic's actors asked a whole
GPU from bundles whose GPU the policy held, and start-up waited forever (hence the timeout mark).
With 1 CPU per node, the two ranks of each group land on different nodes.
"""

from pathlib import Path

import fiddle as fdl
import pytest
import ray
from ray._common.utils import get_ray_address_file
from ray.cluster_utils import Cluster

from rlhf.runtime.placement import PlacementError
from rlhf.runtime.plan import compile_graph
from rlhf.runtime.ray_runtime import RayRuntime
from rlhf.runtime.remote import Remote
from toy_workers import EchoWorker

# method="thread": a Python signal handler does not run while ray.get waits, so only a timer thread ends a hang
pytestmark = [pytest.mark.slow, pytest.mark.timeout(180, method="thread")]


class Roles:
    def __init__(self, policy, critic=None):
        self.policy, self.critic = policy, critic


def roles() -> fdl.Config:
    group = dict(num_workers=2, cpus_per_worker=1, gpus_per_worker=1)
    return fdl.Config(
        Roles,
        policy=fdl.Config(Remote, worker=fdl.Config(EchoWorker), name="policy", **group),
        critic=fdl.Config(Remote, worker=fdl.Config(EchoWorker), name="critic", colocate_with="policy", **group),
    )


def _put_back(path: Path, text: str | None) -> None:
    if text is None:
        path.unlink(missing_ok=True)
    else:
        path.write_text(text)


@pytest.fixture(scope="module")
def cluster(shared_ray):
    shared_ray.stop()  # this process must connect to the two-node cluster, not to the tests' shared one
    # Cluster() writes its address to /tmp/ray/ray_current_cluster, where every bare ray.init() on
    # this machine looks first: other processes would join this test cluster (and fail to start
    # their own while the file outlives it). Put the file back as it was; the test passes the address.
    address_file = Path(get_ray_address_file(None))
    before = address_file.read_text() if address_file.exists() else None
    cluster = Cluster(initialize_head=True, head_node_args=dict(num_cpus=1, num_gpus=1, include_dashboard=False))
    _put_back(address_file, before)
    try:
        cluster.add_node(num_cpus=1, num_gpus=1)
        cluster.wait_for_nodes()
        yield cluster
    finally:
        cluster.shutdown()
        _put_back(address_file, before)


@pytest.fixture(scope="module")
def groups(cluster):
    runtime = RayRuntime(address=cluster.address, ready_timeout_s=120)  # joins it, as address="auto" does
    try:
        yield runtime.start_groups(compile_graph(roles()))
    finally:
        runtime.shutdown()


def test_colocated_critic_shares_its_policy_rank_gpu(groups):
    policy, critic = groups["policy"].where(), groups["critic"].where()
    for p, c in zip(policy, critic):
        assert (c["node_id"], c["gpu_ids"]) == (p["node_id"], p["gpu_ids"])  # same node, same GPU
        assert p["resources"]["GPU"] == c["resources"]["GPU"] == 0.5
        assert (p["resources"]["CPU"], c["resources"].get("CPU", 0)) == (1.0, 0)  # CPU accounting as before


def test_ranks_on_two_nodes_get_local_ranks_and_rank_zero_node_as_master(groups):
    where, envs = groups["policy"].where(), groups["policy"].env()
    assert where[0]["node_id"] != where[1]["node_id"]
    assert [e["RANK"] for e in envs] == ["0", "1"]
    assert [(e["LOCAL_RANK"], e["LOCAL_WORLD_SIZE"]) for e in envs] == [("0", "1"), ("0", "1")]
    assert {e["MASTER_ADDR"] for e in envs} == {where[0]["node_ip"]}
    assert len({e["MASTER_PORT"] for e in envs}) == 1
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == [",".join(w["gpu_ids"]) for w in where]
    assert groups["policy"].all_reduce(1.0) == [3.0, 3.0]  # gloo across the nodes: (1+0) + (1+1)


def test_waiting_for_resources_another_group_holds_times_out_naming_the_group(groups):
    late = fdl.Config(Remote, worker=fdl.Config(EchoWorker), name="late", cpus_per_worker=1)
    runtime = RayRuntime(ready_timeout_s=1)  # the cluster is connected: it joins it
    try:
        with pytest.raises(PlacementError) as err:
            runtime.start_groups(compile_graph(late))
    finally:
        runtime.shutdown()
    message = str(err.value)
    assert message.startswith("group 'late': its placement group (1 bundles of {CPU: 1}, for 'late') was not ready "
                              "within 1 s. The cluster has {CPU: 0, GPU: 0} available of {CPU: 2, GPU: 2}.")
    assert ray.is_initialized()  # the runtime did not connect, so it leaves the connection alone


def test_a_plan_no_node_can_hold_is_refused_before_anything_starts(groups):
    actors = len(ray.util.list_named_actors(all_namespaces=True))
    big = fdl.Config(Remote, worker=fdl.Config(EchoWorker), name="big", cpus_per_worker=2)
    with pytest.raises(PlacementError, match=r"group 'big' \(pool of 'big'\) asks \{CPU: 2\} per worker, more than "
                                             r"any node of the cluster holds \(largest: \{CPU: 1\}\)"):
        RayRuntime().start_groups(compile_graph(big))
    assert len(ray.util.list_named_actors(all_namespaces=True)) == actors
