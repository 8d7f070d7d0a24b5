"""compile_graph: Remote nodes become worker groups; the driver graph gets GroupRefs."""

import fiddle as fdl
import pytest
import torch

from rlhf.batch import Batch
from rlhf.graph.io import from_json
from rlhf.runtime.local import LocalRuntime
from rlhf.runtime.plan import bind_groups, compile_graph
from rlhf.runtime.remote import GroupRef, Remote
from toy_workers import EchoWorker


class Driver:
    def __init__(self, group, other=None, lr: float = 0.1):
        self.group, self.other, self.lr = group, other, lr


def graph(scale=3.0, **remote):
    worker = fdl.Config(EchoWorker, scale=scale)
    return fdl.Config(Driver, group=fdl.Config(Remote, worker=worker, name="echo", **remote))


def test_remote_is_cut_into_a_group_spec():
    plan = compile_graph(graph(num_workers=2, cpus_per_worker=1))
    assert list(plan.groups) == ["echo"]
    spec = plan.groups["echo"]
    assert spec.num_workers == 2 and spec.worker_cls is EchoWorker
    assert fdl.get_callable(plan.driver.group) is GroupRef
    assert from_json(spec.worker_json).scale == 3.0
    assert "group echo: 2 x EchoWorker" in plan.describe()


def test_shared_remote_node_is_one_group():
    g = graph()
    g.other = g.group
    plan = compile_graph(g)
    assert len(plan.groups) == 1
    assert plan.driver.group is plan.driver.other


def test_two_different_groups_with_one_name_is_an_error():
    g = graph()
    g.other = fdl.Config(Remote, worker=fdl.Config(EchoWorker, scale=5.0), name="echo")
    with pytest.raises(ValueError, match="both named 'echo'"):
        compile_graph(g)


def test_colocation_with_unknown_group_is_an_error():
    with pytest.raises(ValueError, match="colocated with 'critic'"):
        compile_graph(graph(colocate_with="critic"))


def test_compile_does_not_modify_the_graph():
    g = graph()
    compile_graph(g)
    assert fdl.get_callable(g.group) is Remote


def test_local_runtime_binds_and_dispatches():
    plan = compile_graph(graph())
    runtime = LocalRuntime()
    groups = runtime.start_groups(plan)
    driver = fdl.build(bind_groups(plan.driver, groups))
    out = driver.group.double(Batch({"x": torch.arange(5)}))
    assert torch.equal(out["y"], torch.arange(5) * 6)
    assert driver.group.count(Batch({"x": torch.arange(5)})) == [5]
    runtime.stop_groups()


def test_unknown_method_lists_the_real_ones():
    groups = LocalRuntime().start_groups(compile_graph(graph()))
    with pytest.raises(AttributeError, match="methods: .*double"):
        groups["echo"].tripple


def test_the_plan_shows_strategy_world_size_and_shard_sizes():
    """FSDP divides every model's parameter bytes over the ranks in the plan's line; DDP does not."""
    import re

    from helpers import group_plan

    for strategy, world, divisor in (("fsdp", 2, 2), ("ddp", 2, 1), ("fsdp", 1, 1)):
        text = group_plan(world, strategy=strategy).describe()
        line = next(x for x in text.splitlines() if "strategy" in x)
        assert line.strip().startswith(f"strategy {strategy}, world size {world}:"), line
        sizes = re.findall(r"(actor|reference) ([\d.]+) MB per rank of ([\d.]+) MB", line)
        assert [name for name, *_ in sizes] == ["actor", "reference"], line
        for _, per_rank, total in sizes:
            assert abs(float(per_rank) * divisor - float(total)) < 2e-3, line
