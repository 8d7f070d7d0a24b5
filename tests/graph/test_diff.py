"""rlhf.graph.diff: the changed leaves of two graphs, with defaults materialized."""

from __future__ import annotations

import copy
import dataclasses

import fiddle as fdl

from rlhf.graph.diff import MISSING, diff_flat, diff_graphs, format_diff


@dataclasses.dataclass
class Trainer:
    total_steps: int = 10
    lr: float = 0.1


@dataclasses.dataclass
class Root:
    stages: dict


def base() -> fdl.Config:
    return fdl.Config(Root, stages={"sft": fdl.Config(Trainer, total_steps=10), "grpo": fdl.Config(Trainer)})


def test_diff_lists_changed_added_and_removed_leaves():
    a = base()
    b = copy.deepcopy(a)
    b.stages["grpo"].lr = 0.5
    b.stages["new"] = fdl.Config(Trainer)
    b.stages["sft"].total_steps = 10  # the same value, set explicitly: no change
    changes = {c.path: (c.old, c.new) for c in diff_graphs(a, b)}
    assert changes["stages.grpo.lr"] == (0.1, 0.5)
    assert changes["stages.new.total_steps"] == (MISSING, 10)
    assert "stages.sft.total_steps" not in changes
    text = format_diff(diff_graphs(a, b), "a", "b")
    assert "~ stages.grpo.lr: 0.1 -> 0.5" in text and "+ stages.new.lr: 0.1" in text
    assert format_diff(diff_graphs(a, a), "a", "a") == "no differences between a and a"
    assert [c.path for c in diff_graphs(fdl.Config(dict, x=1), fdl.Config(dict, x=1.0))] == ["x"]  # types differ


def test_diff_flat_compares_stored_leaves_by_type_and_value():
    old = {"a": 1, "b": "x", "c": 2}
    new = {"a": 1.0, "b": "x", "d": 3}
    assert [(c.path, c.old, c.new) for c in diff_flat(old, new)] == [
        ("a", 1, 1.0),  # 1 == 1.0, but an int and a float are different leaves
        ("c", 2, MISSING),
        ("d", MISSING, 3),
    ]
