"""The memory plan in preflight: `--print_plan` shows each device's predicted peak; a plan that does not fit
is refused before any model loads, naming the largest consumers and settings that would fit."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlhf.runtime import preflight as preflight_package
from rlhf.runtime.preflight import PreflightError, preflight, preflight_report
from rlhf.runtime.preflight import memory as planner
from helpers import load_file

ROOT = Path(__file__).parents[2]


@pytest.fixture(scope="module")
def arithmetic():
    return load_file("experiments/arithmetic_tiny.py")


def test_the_report_has_a_device_per_stage_with_its_largest_terms(arithmetic):
    report = preflight_report(arithmetic.base(), cpus=2, gpus=0)
    assert report.errors == []
    grpo = next(p for p in report.memory if p.stage == "grpo")
    (host,) = grpo.devices
    assert host.name.startswith("host RAM") and 0 < host.peak < host.capacity
    names = [name for name, _ in host.largest(3)]
    assert all(name.startswith("policy ") for name in names)
    table = preflight_package.memory_table(report.memory)
    assert "peak memory" in table and "grpo" in table and "policy: " in table


def test_a_plan_over_the_host_memory_is_refused_with_what_would_fit(arithmetic, monkeypatch):
    graph = arithmetic.base()
    peaks = {p.stage: p.devices[0].peak for p in preflight_report(graph, cpus=2, gpus=0).memory if p.devices}
    largest = max(peaks, key=peaks.get)
    capacity = max(peaks[largest] * 0.8, min(peaks.values()) * 1.01)  # only the largest stage is too big
    monkeypatch.setattr(planner, "host_memory_bytes", lambda: capacity)
    with pytest.raises(PreflightError) as err:
        preflight(graph, cpus=2, gpus=0)
    message = str(err.value)
    assert "is predicted to peak at" in message and "Largest: policy" in message
    fix = message.split("What would fit: --config '")[1].split("'")[0]
    assert message.count("is predicted to peak at") == 1 and f"stage {largest!r}" in message
    assert fix.startswith(f"set:stages.{largest}.policy.worker.")
    # the suggested setting, applied, passes
    from rlhf.config.overrides import set_path

    path, value = fix.removeprefix("set:").split("=")
    set_path(graph, path, eval(value))  # noqa: S307 - a Python literal the message printed
    preflight(graph, cpus=2, gpus=0)


def test_print_plan_prints_the_memory_column(arithmetic, capsys):
    from rlhf.cli.experiment import run_cli

    run_cli(arithmetic, ["--print_plan", "--config", "set:stages.grpo.prompts_per_step=4"])
    out = capsys.readouterr().out
    assert "memory per device" in out and "peak memory" in out


def test_rlhf_plan_memory_answers_what_fits(capsys):
    from rlhf.cli import main

    config = str(ROOT / "rlhf_configs" / "model_configs" / "qwen2.5-7b.json")
    assert main(["plan", "--memory", config, "--gpus", "8", "--gpu-memory", "80"]) == 0
    out = capsys.readouterr().out
    assert "7.62B parameters" in out and "yes" in out and "settings fit" in out
    assert main(["plan", "--memory", config, "--gpus", "1", "--gpu-memory", "16"]) == 1
    assert "nothing fits on 1 x 16 GB" in capsys.readouterr().out


def test_a_multi_turn_rollout_is_planned_at_its_token_budget():
    """An agent rollout's response holds every turn and observation: up to AgentRollout.max_response_tokens,
    longer than one turn's sampling.max_new_tokens."""
    module = load_file("experiments/tool_calculator.py")
    stage = module.base().stages["grpo"]
    workload, _ = planner._workload(stage, "grpo")
    assert stage.sampling.max_new_tokens == 24 and workload.response_tokens == stage.rollout.max_response_tokens == 64
