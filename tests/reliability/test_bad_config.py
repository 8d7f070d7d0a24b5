"""Mistyped or out-of-range values stop the run (and `--print_plan`) in preflight, before any model
loads, naming the field's path, the value and the expected type or range."""

import time

import pytest

from rlhf.cli.experiment import run_cli
from helpers import load_file


@pytest.fixture(scope="module")
def tiny():
    return load_file("experiments/arithmetic_tiny.py")


def refused(module, *commands, plan=False, local=True) -> str:
    argv = [a for c in (*(["fiddler:local"] if local else []), "fiddler:smoke", *commands) for a in ("--config", c)]
    start = time.perf_counter()
    with pytest.raises(SystemExit) as err:
        run_cli(module, argv + (["--print_plan"] if plan else []))
    assert time.perf_counter() - start < 10  # preflight, not a crash after the models loaded
    assert err.value.code not in (0, None)
    return str(err.value.code)


@pytest.mark.parametrize(
    "command, expected",
    [
        ('set:stages.grpo.total_steps="ten"', "stages.grpo.total_steps = 'ten': RLTrainer.total_steps expects int > 0"),
        ("set:stages.grpo.total_steps=2.5", "stages.grpo.total_steps = 2.5: RLTrainer.total_steps expects int > 0"),
        ("set:stages.grpo.prompts_per_step=0", "stages.grpo.prompts_per_step = 0: RLTrainer.prompts_per_step expects int > 0"),
        ("set:stages.grpo.prompts_per_step=-4", "stages.grpo.prompts_per_step = -4: RLTrainer.prompts_per_step expects int > 0"),
        ('set:stages.grpo.policy.worker.optimizer.lr="1e-3"',
         "stages.grpo.policy.worker.optimizer.lr = '1e-3': AdamW.lr expects float | Tensor"),
        ("set:stages.sft.policy.worker.optimizer.lr=-0.1",
         "stages.sft.policy.worker.optimizer.lr = -0.1: AdamW.lr expects float >= 0"),
        ("set:stages.grpo.sampling.top_p=0.0", "stages.grpo.sampling.top_p = 0.0: SamplingParams.top_p expects float in (0, 1]"),
    ],
    ids=["string-steps", "float-steps", "zero-prompts", "negative-prompts", "string-lr", "negative-lr", "zero-top_p"],
)
def test_a_bad_value_is_a_preflight_error_naming_it(tiny, command, expected):
    assert expected in refused(tiny, command)
    assert expected in refused(tiny, command, plan=True)  # --print_plan refuses what the run refuses


def test_a_zero_micro_batch_is_a_preflight_error(tiny):
    message = refused(tiny, "set:stages.grpo.policy.worker.training.micro_batch_size=0")
    assert "stages.grpo.policy.worker.training.micro_batch_size = 0: TrainingSetup.micro_batch_size expects int > 0" in message


def test_print_plan_exits_non_zero_when_the_run_would_refuse(tiny, capsys):
    """3 Ray workers for 20 samples per step: the real run refuses (a padded row would train twice)."""
    message = refused(tiny, "fiddler:workers(n=3)", "set:runtime.num_cpus=3", "set:stages.grpo.prompts_per_step=5",
                      "set:stages.grpo.sampling.n=4", plan=True, local=False)
    assert "20 samples per step do not split evenly over" in message
    run_cli(tiny, ["--config", "fiddler:local", "--config", "fiddler:smoke", "--print_plan"])  # a good plan: exit 0
    assert "batch arithmetic per step" in capsys.readouterr().out
