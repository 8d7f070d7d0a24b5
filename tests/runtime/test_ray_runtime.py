"""RayRuntime: one actor per rank, sharded calls, torch.distributed env per group."""

import fiddle as fdl
import pytest
import torch

from rlhf.batch import Batch
from rlhf.runtime.plan import compile_graph
from rlhf.runtime.ray_runtime import RayRuntime
from rlhf.runtime.remote import Remote
from toy_workers import EchoWorker


@pytest.fixture(scope="module")
def echo_group(shared_ray):
    shared_ray.start()  # the runtime joins the session's cluster
    plan = compile_graph(fdl.Config(Remote, worker=fdl.Config(EchoWorker, scale=1.0), name="echo", num_workers=2))
    runtime = RayRuntime(num_cpus=2)
    groups = runtime.start_groups(plan)
    yield groups["echo"]
    runtime.shutdown()


def test_shard_pads_splits_and_concats(echo_group):
    out = echo_group.double(Batch({"x": torch.arange(5)}))
    assert torch.equal(out["y"], torch.arange(5) * 2)
    assert list(out["rank"]) == ["0", "0", "0", "1", "1"]  # 5 rows padded to 6, split 3 + 3


def test_shard_exact_refuses_uneven_batches(echo_group):
    assert echo_group.count(Batch({"x": torch.arange(6)})) == [3, 3]
    with pytest.raises(ValueError, match="multiple of 2"):
        echo_group.count(Batch({"x": torch.arange(5)}))


def test_each_rank_gets_its_distributed_env(echo_group):
    envs = echo_group.env()
    assert [e["RANK"] for e in envs] == ["0", "1"]
    assert {e["WORLD_SIZE"] for e in envs} == {"2"}
    assert len({e["MASTER_PORT"] for e in envs}) == 1
    assert [(e["LOCAL_RANK"], e["LOCAL_WORLD_SIZE"]) for e in envs] == [("0", "2"), ("1", "2")]  # one node
    assert {e["MASTER_ADDR"] for e in envs} == {echo_group.where()[0]["node_ip"]}  # rank 0's node
    assert echo_group.all_reduce(1.0) == [3.0, 3.0]  # (1+0) + (1+1) over gloo


def test_shards_are_balanced_by_tokens_and_results_keep_row_order(echo_group):
    mask = torch.zeros(6, 9, dtype=torch.long)
    for i, n in enumerate([9, 8, 7, 1, 1, 1]):  # contiguous halves: 24 vs 3 tokens
        mask[i, 9 - n :] = 1
    batch = Batch({"x": torch.arange(6), "attention_mask": mask})
    shards = echo_group.rows(batch)
    assert sorted(s["tokens"] for s in shards) == [11, 16]  # 3 rows each: {9,1,1} / {8,7,1} is the best split
    assert sorted(x for s in shards for x in s["x"]) == list(range(6))
    out = echo_group.double(batch.index(slice(0, 5)))  # padded to 6, balanced, unpadded
    assert out["y"].tolist() == [0, 2, 4, 6, 8]
    assert sorted(set(out["rank"])) == ["0", "1"]
