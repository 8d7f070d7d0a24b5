"""benchmarks/main_job.py: a seed reaches the SFT batch order and the GRPO sampling seed of the shipped graph,
the runtime and tracking follow its flags, and the summary's mean and range are right."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import main_job  # noqa: E402


@pytest.mark.parametrize("runtime,tracking", [("local", False), ("ray", True)])
def test_seed_commands_set_both_stage_seeds(runtime, tracking):
    import fiddle as fdl

    from rlhf.cli.experiment import build_graph, load_experiment

    graph, _ = build_graph(load_experiment(str(main_job.RECIPE)), main_job.seed_commands(7, runtime, tracking))
    assert graph.stages["sft"].seed == 7 and graph.stages["grpo"].seed == 7
    assert graph.stages["sft"].total_steps == 250 and graph.stages["grpo"].total_steps == 250  # the recipe, unchanged
    assert fdl.get_callable(graph.runtime).__name__ == ("LocalRuntime" if runtime == "local" else "RayRuntime")
    assert (graph.tracker is not None) == tracking
    assert graph.progress is False  # fiddler:quiet: no progress bars in the benchmark's log


def test_spread_is_mean_and_range():
    # (0.362 + 0.444 + 0.401) / 3 = 1.207 / 3 = 0.402333 -> 0.4023
    assert main_job.spread([0.362, 0.444, 0.401]) == {"mean": 0.4023, "min": 0.362, "max": 0.444}
