"""The benchmarks' instrumented policy workers take every argument the worker's own methods take.

They override PolicyWorker's methods to time them; when a method gained an argument (`generate`'s
`keep_awake`), the override refused it and every `grpo_vs_trl.py --model` run failed. This pins it."""

import inspect
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from bench_worker import MemoryPolicyWorker, TimedPolicyWorker  # noqa: E402

from rlhf.workers.policy import PolicyWorker


def _arguments(method) -> dict:
    """Every parameter of `method` but self, by keyword, with a placeholder value."""
    params = inspect.signature(inspect.unwrap(method)).parameters
    return {name: object() for name, p in params.items()
            if name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}


@pytest.mark.parametrize("wrapper", [TimedPolicyWorker, MemoryPolicyWorker])
def test_overrides_accept_every_argument_of_the_workers_methods(wrapper):
    overridden = [name for name, value in vars(wrapper).items()
                  if callable(value) and not name.startswith("_") and hasattr(PolicyWorker, name)]
    assert "generate" in overridden
    for name in overridden:
        arguments = _arguments(getattr(PolicyWorker, name))
        inspect.signature(inspect.unwrap(getattr(wrapper, name))).bind(None, **arguments)  # TypeError if one is refused


def test_the_compile_variant_compiles_the_policy_and_the_others_do_not():
    """`grpo_vs_trl.py --frameworks local+compile` reaches the policy's TrainingSetup (and only that variant)."""
    from bench_workloads import Workload, our_graph

    w = Workload("tiny", 8, 0.04)
    knob = lambda g: g.stages["grpo"].policy.worker.training.compile  # noqa: E731
    assert knob(our_graph(w, "/nonexistent", "local", 2, "/tmp/x", compile=True)) is True
    assert knob(our_graph(w, "/nonexistent", "local", 2, "/tmp/x")) is False
