"""`PolicyGroup` (the trainers' typed view of a policy worker group) states what the group really does:
each of its methods is a `PolicyWorker` method with the same parameters and defaults, and returns what
the method's dispatch mark makes of the worker's result (one Batch for `@shard`, a per-rank list else)."""

from __future__ import annotations

import inspect

import pytest

from rlhf.runtime.group import WorkerGroup
from rlhf.workers.dispatch import dispatch_mode
from rlhf.workers.policy import PolicyWorker
from rlhf.workers.policy_group import PolicyGroup

GROUP_ONLY = {"deferred"}  # the group's own method (WorkerGroup.deferred), not a worker's
METHODS = sorted(name for name, member in vars(PolicyGroup).items()
                 if inspect.isfunction(member) and not name.startswith("_") and name not in GROUP_ONLY)


def parameters(fn) -> list[tuple[str, object]]:
    return [(p.name, p.default) for p in inspect.signature(fn).parameters.values() if p.name != "self"]


@pytest.mark.parametrize("name", METHODS)
def test_each_method_is_the_workers_with_the_group_return_type(name):
    worker, group = getattr(PolicyWorker, name), getattr(PolicyGroup, name)
    assert parameters(group) == parameters(worker)
    returns = inspect.signature(worker).return_annotation
    wanted = returns if dispatch_mode(PolicyWorker, name) == "shard" else f"list[{returns}]"
    assert inspect.signature(group).return_annotation == wanted


def test_the_trainers_calls_are_all_stated():
    # every policy-group call the RL trainer and the rollout producers make is in the protocol
    import ast
    from pathlib import Path

    root = Path(__file__).parents[2] / "rlhf"
    called = set()
    for path in [root / "trainers" / "rl.py", root / "trainers" / "async_rollout.py", root / "agents" / "rollout.py"]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.value, (ast.Attribute, ast.Name)):
                owner = node.value.attr if isinstance(node.value, ast.Attribute) else node.value.id
                if owner == "policy":
                    called.add(node.attr)
    stated = set(METHODS) | GROUP_ONLY | {"name", "world_size"}
    assert called <= stated, called - stated
    assert all(callable(getattr(WorkerGroup, m)) for m in GROUP_ONLY)
