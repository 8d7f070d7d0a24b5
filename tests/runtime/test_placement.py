"""Placement rules (GPU shares of colocated groups, preflight of impossible placements) and the
torch.distributed env per rank (LOCAL_RANK per node, MASTER_ADDR of rank 0's node); no Ray here."""

import fiddle as fdl
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlhf.runtime.dist_env import ActorSite, distributed_env, local_ranks
from rlhf.runtime.placement import cluster_problems, placements
from rlhf.runtime.plan import compile_graph
from rlhf.runtime.remote import Remote
from toy_workers import EchoWorker


class Roles:
    def __init__(self, policy, critic=None, reward_model=None):
        self.policy, self.critic, self.reward_model = policy, critic, reward_model


def remote(name, **kwargs):
    return fdl.Config(Remote, worker=fdl.Config(EchoWorker), name=name, **kwargs)


def plan(policy=None, **others):
    policy = dict(num_workers=2, gpus_per_worker=1) if policy is None else policy
    return compile_graph(fdl.Config(Roles, policy=remote("policy", **policy),
                                    **{k: remote(k, **v) for k, v in others.items()}))


SHARED = dict(num_workers=2, gpus_per_worker=1, colocate_with="policy")


@pytest.mark.parametrize("others, expected_gpus", [
    ({}, {"policy": 1.0}),  # alone: the whole bundle
    ({"critic": SHARED}, {"policy": 0.5, "critic": 0.5}),
    # 1/3 rounded down to Ray's 1e-4 steps, so three shares (0.9999) fit the bundle
    ({"critic": SHARED, "reward_model": SHARED}, {"policy": 0.3333, "critic": 0.3333, "reward_model": 0.3333}),
    # a CPU-only role in a GPU pool takes no share
    ({"critic": dict(SHARED, gpus_per_worker=0)}, {"policy": 1.0, "critic": 0.0}),
])
def test_colocated_groups_split_the_bundle_gpu_equally(others, expected_gpus):
    where = placements(plan(**others).groups)
    assert {name: p.num_gpus for name, p in where.items()} == pytest.approx(expected_gpus)
    assert sum(p.num_gpus for p in where.values()) <= 1.0  # every share fits the 1-GPU bundle
    assert {p.pool for p in where.values()} == {"policy"}
    assert all(p.bundle == {"CPU": 1.0, "GPU": 1.0} for p in where.values())


def test_cpu_accounting_is_unchanged_owner_asks_the_bundle_colocated_ask_nothing():
    where = placements(plan(dict(num_workers=2, cpus_per_worker=2), critic=dict(num_workers=2, cpus_per_worker=3,
                                                                               colocate_with="policy")).groups)
    assert where["policy"].bundle == {"CPU": 2.0}
    assert (where["policy"].num_cpus, where["policy"].num_gpus) == (2.0, 0.0)
    assert (where["critic"].num_cpus, where["critic"].num_gpus) == (0.0, 0.0)


def test_plan_describes_the_gpu_share():
    text = plan(critic=SHARED).describe()
    assert "group critic: 2 x EchoWorker (cpus 1.0, gpus 1.0 per worker, colocated with policy, 0.5 GPU per actor" in text


@pytest.mark.parametrize("policy, others, message", [
    (None, {"critic": dict(SHARED, num_workers=1)},
     "group 'critic' has 1 workers but is colocated with 'policy', which has 2: .* set num_workers=2"),
    (dict(num_workers=2), {"critic": SHARED},
     "group 'critic' asks 1 GPU per worker but is colocated with 'policy', whose bundles hold no GPU: .*"
     "Set gpus_per_worker=0 on 'critic'"),
    (None, {"critic": dict(SHARED, gpus_per_worker=0.5)},
     "colocated groups share the owner's GPUs, so set gpus_per_worker=1"),
    (dict(num_workers=2, gpus_per_worker=2), {"critic": dict(SHARED, gpus_per_worker=2)},
     "whose workers hold 2 GPUs each: .* Use at most 1 GPU per worker in a colocated pool"),
    (None, {"critic": SHARED, "reward_model": dict(SHARED, colocate_with="critic")},
     "group 'reward_model' is colocated with 'critic', which is itself colocated with 'policy': .*"
     r"\(colocate_with='policy'\)"),
    (None, {"critic": dict(SHARED, colocate_with="critic")}, "group 'critic' is colocated with itself"),
])
def test_unplaceable_colocation_is_refused_when_the_plan_is_compiled(policy, others, message):
    # compile_graph runs in preflight (rlhf.runtime.preflight), so this is reported before any actor starts
    with pytest.raises(ValueError, match=message):
        plan(policy, **others)


def test_bundle_no_node_can_hold_and_totals_beyond_the_cluster_are_named():
    groups = plan(dict(num_workers=2, cpus_per_worker=4, gpus_per_worker=1), critic=SHARED).groups
    nodes = [{"CPU": 8.0, "GPU": 1.0}, {"CPU": 2.0, "GPU": 1.0}]
    assert cluster_problems(groups, nodes) == []  # one bundle of {CPU 4, GPU 1} per node fits
    problems = cluster_problems(groups, [{"CPU": 2.0, "GPU": 1.0}, {"CPU": 2.0, "GPU": 1.0}])
    assert len(problems) == 2
    assert problems[0].startswith("group 'policy' (pool of 'policy', 'critic') asks {CPU: 4, GPU: 1} per worker, "
                                  "more than any node of the cluster holds (largest: {CPU: 2, GPU: 1})")
    assert problems[1].startswith("the groups need {CPU: 8, GPU: 2} in all (policy: 2 x (4 CPU, 1 GPU);")
    assert "but the cluster has {CPU: 4, GPU: 2}" in problems[1]


def site(node, gpus=(), port=None, ip=None):
    return ActorSite(node_id=node, node_ip=ip or f"10.0.0.{ord(node[-1]) - 96}", gpu_ids=tuple(gpus), port=port)


def test_local_ranks_count_ranks_per_node_in_rank_order():
    # ranks 0..4 on nodes a, b, a, a, b
    assert local_ranks(["a", "b", "a", "a", "b"]) == [(0, 3), (0, 2), (1, 3), (2, 3), (1, 2)]


@given(st.lists(st.sampled_from("abcd"), min_size=1, max_size=12))
def test_local_ranks_number_each_node_from_zero(nodes):
    ranks = local_ranks(nodes)
    for node in set(nodes):
        mine = [lr for lr, n in zip(ranks, nodes) if n == node]
        assert [r for r, _ in mine] == list(range(len(mine)))
        assert {size for _, size in mine} == {len(mine)}


def test_master_is_rank_zero_node_and_each_node_sees_its_ranks_gpus_in_local_rank_order():
    sites = [site("node-b", ["3"], port=29511), site("node-a", ["0"]), site("node-b", ["1"]), site("node-a", ["2"])]
    envs = distributed_env(sites)
    assert {(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in envs} == {("10.0.0.2", "29511")}  # rank 0's node
    assert [e["RANK"] for e in envs] == ["0", "1", "2", "3"]
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "0", "1", "1"]
    assert {e["LOCAL_WORLD_SIZE"] for e in envs} == {"2"}
    # cuda:LOCAL_RANK is the rank's own GPU: rank 2 (local 1 on node b) has GPU 1, listed second there
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["3,1", "0,2", "3,1", "0,2"]


@pytest.mark.parametrize("gpus", [
    [(), ()],  # CPU workers
    [("0",), ("0",)],  # two ranks on one GPU (fractional owner): indices would collide
    [("0", "1"), ("2", "3")],  # several GPUs per rank
])
def test_ray_keeps_its_own_visible_devices_where_one_gpu_per_rank_does_not_hold(gpus):
    envs = distributed_env([site("node-a", gpus[0], port=1), site("node-a", gpus[1])])
    assert all("CUDA_VISIBLE_DEVICES" not in e for e in envs)


def test_rank_zero_must_report_a_port():
    with pytest.raises(ValueError, match="rank 0 must report a free port"):
        distributed_env([site("node-a"), site("node-a", port=1)])
