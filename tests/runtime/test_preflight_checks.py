"""Checks before anything starts: each problem has its own message saying what to change."""

from __future__ import annotations


import fiddle as fdl
import pytest

import rlhf_configs.common as common
from rlhf.algos import GAE, RLOO, ReinforcePlusPlus
from rlhf.runtime.preflight import PreflightError, batch_arithmetic, batch_table, check_experiment, preflight
from rlhf.runtime.ray_runtime import RayRuntime
from helpers import load_file


@pytest.fixture(scope="module")
def arithmetic():
    return load_file("experiments/arithmetic_tiny.py")


def errors(graph, **kwargs):
    return check_experiment(graph, cpus=kwargs.pop("cpus", 16), gpus=kwargs.pop("gpus", 0), **kwargs).errors


def grpo_row(table: str) -> list[str]:
    """The first four cells (stage, prompts, n, samples) of the table's grpo row (the batch table's: the
    memory table printed after it has a grpo row too)."""
    return [line.split()[:4] for line in table.splitlines() if line.strip().startswith("grpo")][0]


def one_error(graph, **kwargs) -> str:
    found = errors(graph, **kwargs)
    assert len(found) == 1, found
    return found[0]


def test_the_shipped_experiment_passes_and_its_batch_table_has_the_numbers(arithmetic):
    graph = arithmetic.base()
    report = check_experiment(graph, cpus=2, gpus=0)
    assert report.errors == [] and report.warnings == []
    sft, grpo = report.batches
    # SFT: 128 examples on 1 worker, 1 mini-batch, micro-batches of 128 -> 1 x 128, 1 optimizer step.
    assert (sft.stage, sft.samples, sft.workers, sft.rows_per_worker, sft.micro_batches) == ("sft", 128, 1, 128, 1)
    # GRPO: 64 prompts x 8 samples = 512 rows, micro-batches of 128 -> 4, one optimizer step.
    assert (grpo.stage, grpo.prompts, grpo.n, grpo.samples, grpo.micro_batches, grpo.optimizer_steps) == (
        "grpo", 64, 8, 512, 4, 1)
    table = batch_table(report.batches)
    assert "prompts" in table and "rows/worker" in table and "optimizer steps" in table
    assert grpo_row(table) == ["grpo", "64", "8", "512"]


def test_table_counts_workers_mini_and_micro_batches(arithmetic):
    graph = arithmetic.base()
    common.workers(graph, n=2)
    worker = graph.stages["grpo"].policy.worker
    worker.training.mini_batches, worker.training.micro_batch_size, worker.training.epochs = 4, 8, 2
    (_, grpo) = batch_arithmetic(graph)
    # 512 samples / 2 workers = 256 rows; 4 mini-batches of 64; micro-batches of 8 -> 8; 2 epochs x 4 = 8 steps.
    assert (grpo.rows_per_worker, grpo.rows_per_mini_batch, grpo.micro_batches, grpo.optimizer_steps) == (256, 64, 8, 8)


def test_local_runtime_counts_one_worker_and_says_so(arithmetic):
    graph = arithmetic.base()
    common.workers(graph, n=2)
    common.local(graph)
    sft, _ = batch_arithmetic(graph)
    assert sft.workers == 1 and "LocalRuntime" in sft.note
    assert "LocalRuntime runs the 'policy' group with 1 worker instead of 2" in batch_table([sft])


def test_samples_that_do_not_split_over_workers(arithmetic):
    graph = arithmetic.base()
    common.workers(graph, n=3)
    graph.stages["grpo"].prompts_per_step = 16
    graph.stages["sft"].batch_size = 96  # divisible by 3; GRPO's 16 x 8 = 128 is not
    message = one_error(graph)
    assert "stage 'grpo': prompts_per_step x sampling.n = 16 x 8 = 128 samples per step do not split evenly over 3" \
        in message
    assert "@shard_exact" in message
    assert "set:stages.grpo.prompts_per_step=18" in message  # the next multiple of 3
    assert "fiddler:workers(n=2)" in message


def test_rows_that_do_not_split_into_mini_batches(arithmetic):
    graph = arithmetic.base()
    graph.stages["grpo"].prompts_per_step = 16
    graph.stages["grpo"].policy.worker.training.mini_batches = 3
    message = one_error(graph)
    assert "each worker's 128 rows per step do not split into 3 equal mini-batches" in message
    assert "set:stages.grpo.policy.worker.training.mini_batches=2" in message  # the closest divisor of 128


def test_more_mini_batches_than_rows(arithmetic):
    graph = arithmetic.base()
    graph.stages["sft"].batch_size = 4
    graph.stages["sft"].policy.worker.training.mini_batches = 8
    assert "each worker gets 4 rows per step but the policy worker wants 8 mini-batches" in one_error(graph)


def test_micro_batches_that_do_not_divide_are_a_warning(arithmetic):
    graph = arithmetic.base()
    graph.stages["grpo"].prompts_per_step = 16
    graph.stages["grpo"].policy.worker.training.micro_batch_size = 48
    report = check_experiment(graph, cpus=16, gpus=0)
    assert report.errors == []
    (warning,) = report.warnings
    assert "micro_batch_size=48 does not divide the 128 rows" in warning and "last micro-batch has 32 rows" in warning


def test_gpus_asked_for_on_a_machine_without_them(arithmetic):
    graph = arithmetic.base()
    graph.stages["grpo"].policy.gpus_per_worker = 1
    message = one_error(graph, gpus=0)
    assert "stage 'grpo' needs 1 GPUs" in message and "this machine has none" in message
    assert 'fiddler:gin(path="cpu.gin")' in message
    assert errors(graph, gpus=1) == []
    common.local(graph)
    assert "stage 'grpo' asks for GPUs" in one_error(graph, gpus=0)


def test_more_cpus_than_the_local_ray_cluster_has(arithmetic):
    graph = arithmetic.base()
    common.workers(graph, n=4)
    message = errors(graph, cpus=2)[0]
    assert "needs 4 CPUs" in message and "this machine has 2" in message
    assert "fiddler:workers(n=2)" in message and "fiddler:local" in message
    graph.runtime = fdl.Config(RayRuntime, num_cpus=3)
    assert "RayRuntime.num_cpus=3: Ray would wait forever" in errors(graph, cpus=2)[0]
    graph.runtime = fdl.Config(RayRuntime, address="auto")  # an existing cluster: not ours to count
    assert errors(graph, cpus=2) == []


def test_an_estimator_that_needs_a_critic(arithmetic):
    graph = arithmetic.base()
    graph.stages["grpo"].advantage = fdl.Config(GAE)
    message = one_error(graph)
    assert message.startswith("stages.grpo.advantage: GAE needs a critic")
    assert "RLTrainer.advantage = @rlhf.algos.GRPO()" in message


def test_a_kl_loss_without_a_reference_model(arithmetic):
    graph = arithmetic.base()
    graph.stages["grpo"].policy.worker.ref_model_path = None
    message = one_error(graph)
    assert message.startswith("stages.grpo.policy.worker.ref_model_path: the objective has a KL loss")
    assert "set:stages.grpo.policy.worker.objective.kl_loss=None" in message
    graph.stages["grpo"].policy.worker.objective.kl_loss = None
    assert errors(graph) == []


@pytest.mark.parametrize("estimator", [None, RLOO])
def test_a_group_estimator_with_one_sample_per_prompt(arithmetic, estimator):
    graph = arithmetic.base()
    if estimator is not None:
        graph.stages["grpo"].advantage = fdl.Config(estimator)
    graph.stages["grpo"].sampling.n = 1
    message = one_error(graph)
    name = "RLOO" if estimator else "GRPO"
    assert message.startswith(f"stages.grpo.sampling.n: {name} compares the samples of each prompt")
    assert "set:stages.grpo.sampling.n=8" in message
    graph.stages["grpo"].advantage = fdl.Config(ReinforcePlusPlus)  # one sample per prompt is fine here
    assert errors(graph) == []


def test_a_required_argument_left_unset(arithmetic):
    graph = arithmetic.base()
    del graph.stages["sft"].policy.worker.model_path
    message = one_error(graph)
    assert message.startswith("stages.sft.policy.worker.model_path: PolicyWorker needs `model_path`, which is not set")
    assert "--config 'set:stages.sft.policy.worker.model_path=...'" in message


def test_a_partial_may_leave_arguments_to_its_caller(arithmetic):
    graph = arithmetic.base()  # the optimizer is fdl.Partial(AdamW, lr=...): `params` comes at call time
    assert "params" not in graph.stages["sft"].policy.worker.optimizer.__arguments__
    assert errors(graph) == []


def test_stage_outputs_of_stages_that_do_not_run_first(arithmetic):
    graph = arithmetic.base()
    message = one_error(graph, stages=["grpo"])
    assert "stage 'grpo' uses the output 'checkpoint' of stage 'sft', which is not among the stages to run" in message
    assert "--stages sft,grpo" in message
    graph.stages = {"grpo": graph.stages["grpo"], "sft": graph.stages["sft"]}
    assert any("which has not run before it" in e for e in errors(graph))
    assert "--stages names 'gpro'" in errors(arithmetic.base(), stages=["gpro"])[0]


def test_preflight_reports_checks_and_hooks_together(arithmetic, tmp_path):
    graph = arithmetic.base()
    graph.stages["grpo"].sampling.n = 1
    graph.stages["sft"].policy.worker.model_path = str(tmp_path / "no-such-model")
    with pytest.raises(PreflightError) as err:
        preflight(graph, cpus=16, gpus=0)
    text = str(err.value)
    assert text.startswith("the experiment cannot start:")
    assert "GRPO compares the samples" in text and "no-such-model" in text


def test_the_cli_prints_the_batch_table_with_the_plan(arithmetic, capsys):
    from rlhf.cli.experiment import run_cli

    run_cli(arithmetic, ["--print_plan", "--config", "set:stages.grpo.prompts_per_step=4"])
    out = capsys.readouterr().out
    assert "batch arithmetic per step" in out
    assert grpo_row(out) == ["grpo", "4", "8", "32"]


def test_the_cli_stops_with_the_message_before_running(arithmetic, tmp_path):
    from rlhf.cli.experiment import run_cli

    with pytest.raises(SystemExit) as err:
        run_cli(arithmetic, ["--config", "set:stages.grpo.sampling.n=1", "--config", f"set:output_dir='{tmp_path}'"])
    assert str(err.value).startswith("error: the experiment cannot start:")
    assert "set:stages.grpo.sampling.n=8" in str(err.value)
    assert not any(tmp_path.iterdir())  # nothing ran


def test_a_required_argument_of_the_root():
    from rlhf.runtime.experiment import Experiment

    expected = ("name: Experiment needs `name`, which is not set. Set it in the experiment's graph, or on the "
                "command line: --config 'set:name=...'.")
    assert errors(fdl.Config(Experiment, stages={})) == [expected]


def test_a_critic_warm_up_that_never_lets_the_actor_train_is_warned_about(arithmetic):
    graph = arithmetic.base()
    arithmetic.ppo(graph)  # critic_warmup=5
    graph.stages["grpo"].total_steps = 5
    (warning,) = check_experiment(graph, cpus=16, gpus=0).warnings
    assert "stages.grpo.critic_warmup=5 >= total_steps=5: the actor is never updated" in warning
    assert "set:stages.grpo.critic_warmup=4" in warning
    graph.stages["grpo"].total_steps = 6
    assert check_experiment(graph, cpus=16, gpus=0).warnings == []
    arithmetic.smoke(graph)  # 2 steps: smoke lowers the warm-up so the actor still trains
    assert graph.stages["grpo"].critic_warmup == 1 and check_experiment(graph, cpus=16, gpus=0).warnings == []


def test_a_critic_warm_up_without_a_critic_is_warned_about(arithmetic):
    graph = arithmetic.base()
    graph.stages["grpo"].critic_warmup = 3
    (warning,) = check_experiment(graph, cpus=16, gpus=0).warnings
    assert "critic_warmup=3 without a critic: the first 3 steps generate and score but train nothing" in warning
