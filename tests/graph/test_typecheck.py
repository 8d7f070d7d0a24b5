"""Every configured value against its annotation and range markers: one mechanism, no per-field code."""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Callable, Sequence
from typing import Annotated, Any, Literal, Protocol

import fiddle as fdl
import pytest
import torch

from rlhf.graph.typecheck import annotation_problems, describe, violation
from rlhf.ranges import Interval, MultipleOf, NonNegativeInt, OpenUnitInterval, PositiveFloat, PositiveInt
from rlhf.rollout.sampling import SamplingParams
from rlhf.runtime.remote import Remote
from rlhf.trainers.rl import RLTrainer


class _Shape(Protocol):
    def area(self) -> float: ...


CASES = [
    # (value, annotation, expected text or None when it fits)
    (3, PositiveInt, None),
    (0, PositiveInt, "int > 0"),
    (-4, PositiveInt, "int > 0"),
    ("ten", PositiveInt, "int > 0"),
    (2.5, PositiveInt, "int > 0"),
    (True, int, "int"),  # a bool is never a count
    (3, float, None),  # PEP 484: an int fits float
    ("3e-4", float, "float"),
    (0.0, PositiveFloat, "float > 0"),
    (0, NonNegativeInt, None),
    (None, PositiveInt | None, None),
    (0, PositiveInt | None, "int > 0 | None"),
    (1.0, Annotated[float, OpenUnitInterval], None),
    (0.0, Annotated[float, OpenUnitInterval], "float in (0, 1]"),
    (1.5, Annotated[float, Interval(ge=0, lt=1)], "float in [0, 1)"),
    (6, Annotated[int, MultipleOf(4)], "int a multiple of 4"),
    ("fp16", Literal["bf16", "fp32"], "one of 'bf16', 'fp32'"),
    ("fp32", Literal["bf16", "fp32"], None),
    ([1, 2], tuple[int, ...], None),  # command-line literals are lists
    ([1, "x"], tuple[int, ...], "tuple[int, ...]"),
    ((1, 2), tuple[int, int, int], "tuple[int, int, int]"),
    ({"a": 1}, dict[str, int], None),
    ({"a": "1"}, dict[str, int], "dict[str, int]"),
    (["a"], Sequence[str], None),
    (len, Callable[..., int], None),
    (3, Callable[..., int], "Callable[..., int]"),
    ("out/x", pathlib.Path, None),
    (torch.float32, torch.dtype, None),
    (object(), _Shape, None),  # not runtime-checkable: cannot tell, so it passes
    (5, Any, None),
    (fdl.Config(int), PositiveInt, None),  # a sub-graph: its type is known only once built
]


@pytest.mark.parametrize("value, annotation, expected", CASES, ids=[repr(c[:2])[:50] for c in CASES])
def test_violation_table(value, annotation, expected):
    assert violation(value, annotation) == expected


def test_describe_names_type_and_range():
    assert describe(PositiveInt | None) == "int > 0 | None"
    assert describe(Annotated[float, Interval(gt=0, le=1)]) == "float in (0, 1]"


@dataclasses.dataclass
class _Toy:
    steps: PositiveInt = 1
    name: str = "x"


def test_problems_name_path_value_and_owner():
    graph = fdl.Config(dict, a=fdl.Config(_Toy, steps="ten", name=3), b=fdl.Config(_Toy, steps=2))
    problems = annotation_problems([(graph.a, "a"), (graph.b, "b")])
    assert problems == [
        "a.steps = 'ten': _Toy.steps expects int > 0",
        "a.name = 3: _Toy.name expects str",
    ]


def test_trainer_sampling_remote_and_a_torch_optimizer_are_covered():
    """The markers in the signatures are what is checked (no code names these fields)."""
    nodes = [
        (fdl.Config(RLTrainer, prompts_per_step=0, total_steps=2.5), "rl"),
        (fdl.Config(SamplingParams, n=0, top_p=0.0, temperature=-1.0), "rl.sampling"),
        (fdl.Config(Remote, num_workers=-1, name="policy"), "rl.policy"),
        (fdl.Partial(torch.optim.AdamW, lr="3e-4"), "rl.policy.worker.optimizer"),
        (fdl.Partial(torch.optim.AdamW, lr=-1.0), "rl.critic.worker.optimizer"),
    ]
    assert annotation_problems(nodes) == [
        "rl.prompts_per_step = 0: RLTrainer.prompts_per_step expects int > 0",
        "rl.total_steps = 2.5: RLTrainer.total_steps expects int > 0",
        "rl.sampling.n = 0: SamplingParams.n expects int > 0",
        "rl.sampling.temperature = -1.0: SamplingParams.temperature expects float >= 0",
        "rl.sampling.top_p = 0.0: SamplingParams.top_p expects float in (0, 1]",
        "rl.policy.num_workers = -1: Remote.num_workers expects int > 0",
        "rl.policy.worker.optimizer.lr = '3e-4': AdamW.lr expects float | Tensor",
        "rl.critic.worker.optimizer.lr = -1.0: AdamW.lr expects float >= 0",
    ]
