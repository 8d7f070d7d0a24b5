"""A component given where a factory is expected (`records=fdl.Config(RolloutRecorder)` instead of
`fdl.Partial(...)`) is a preflight error naming the path and the fix, before any model loads (it
was a `TypeError: 'RolloutRecorder' object is not callable` after the models had loaded)."""

import time

import fiddle as fdl
import pytest

from rlhf.cli.experiment import build_graph
from rlhf.runtime.experiment import run_experiment
from rlhf.runtime.preflight import PreflightError
from rlhf.trainers.records import RolloutRecorder
from helpers import load_file


@pytest.fixture(scope="module")
def tiny():
    return load_file("experiments/arithmetic_tiny.py")


def test_an_instance_given_for_a_factory_is_a_preflight_error(tiny, tmp_path):
    graph, _ = build_graph(tiny, ["fiddler:local", "fiddler:smoke", "fiddler:no_tracking",
                                  f"set:output_dir={str(tmp_path)!r}"])
    graph.stages["grpo"].records = fdl.Config(RolloutRecorder, sample_rate=0.5)
    start = time.monotonic()
    with pytest.raises(PreflightError) as err:
        run_experiment(graph)
    assert time.monotonic() - start < 10  # before any model loads
    message = str(err.value)
    assert "stages.grpo.records = " in message and "RLTrainer.records expects Callable[[], rlhf.trainers.records.RolloutRecorder] | None" in message
    assert "fdl.Partial(RolloutRecorder" in message
    assert not (tmp_path / "arithmetic_tiny").exists() or not any((tmp_path / "arithmetic_tiny").rglob("final"))


def test_a_factory_and_a_component_where_one_is_expected_pass(tiny, tmp_path):
    from rlhf.runtime.preflight import preflight

    graph, _ = build_graph(tiny, ["fiddler:local", "fiddler:smoke", "fiddler:no_tracking",
                                  f"set:output_dir={str(tmp_path)!r}"])
    graph.stages["grpo"].records = fdl.Partial(RolloutRecorder, sample_rate=0.5)
    preflight(graph)  # no error: a factory, and every fdl.Config of a component where an instance is expected
