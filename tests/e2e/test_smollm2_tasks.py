"""The default task recipe end to end on SmolLM2: two tiny GRPO steps of experiments/smollm2_tasks.py on a
reasoning-gym task between its two test stages, with the validation's strict and lenient scores, the spread of the
held-out answers, the alarm's metrics and the reward's partial share in the metrics."""

import fiddle as fdl

import pytest

import rlhf_configs.common as common
from rlhf.cli.experiment import build_graph, load_experiment
from rlhf.runtime.experiment import run_experiment

SOURCE = "reasoning_gym/gcd"


@pytest.mark.real_model
def test_smoke_trains_and_validates_a_reasoning_gym_task_on_smollm2(smollm2_path, tmp_path):
    pytest.importorskip("reasoning_gym", reason="needs the [tasks] extra (reasoning-gym)")
    recipe = load_experiment("experiments/smollm2_tasks.py")
    graph, _ = build_graph(recipe, [
        f'config:base(task="{SOURCE}", settings={{"min_value": 1, "max_value": 20}}, model="{smollm2_path}")',
        "fiddler:smoke", "fiddler:local", "fiddler:no_tracking"])
    common.quiet(graph)
    graph.output_dir = str(tmp_path / "out")
    heldout_rows = fdl.build(graph.stages["grpo"].evaluator.dataset.rows)
    test_rows = fdl.build(graph.stages["test"].evaluator.dataset.rows)
    # the validation rows (they pick best/) are not the test rows (they measure it)
    assert not {r["extra_info"]["question"] for r in heldout_rows} & {r["extra_info"]["question"] for r in test_rows}
    results = run_experiment(graph)
    metrics = results["grpo"]["metrics"]
    # the test rows measured the instruct model before training and the last weights after it
    for stage in ("base", "test"):
        tested = results[stage]["metrics"]
        assert 0.0 <= tested[f"val-core/{SOURCE}/reward/mean@1"] <= tested[f"val-aux/{SOURCE}/lenient/mean@1"] <= 1.0
    strict, lenient = metrics[f"val-core/{SOURCE}/reward/mean@1"], metrics[f"val-aux/{SOURCE}/lenient/mean@1"]
    assert 0.0 <= strict <= lenient <= 1.0  # right in the asked-for form is also right format aside
    # the training reward reports how much of it came only from the half credit for an unformatted right answer
    assert 0.0 <= metrics[f"reward/extra/{SOURCE}/partial/mean"] <= 1.0
    assert metrics["response_length/mean"] <= 8  # the smoke fiddler's limit
    # how spread out SmolLM2's greedy answers to the 4 held-out rows are, against the right answers' own spread
    truths = [r["reward_model"]["ground_truth"] for r in heldout_rows]
    assert len(truths) == 4
    assert metrics[f"val-aux/{SOURCE}/answers/truth_top_share"] == max(map(truths.count, truths)) / 4
    top, distinct = metrics[f"val-aux/{SOURCE}/answers/top_share"], metrics[f"val-aux/{SOURCE}/answers/distinct"]
    assert top in (0.25, 0.5, 0.75, 1.0) and distinct in (0.25, 0.5, 0.75, 1.0)
    assert top + distinct <= 1.25  # k distinct answers of 4: the most common one is at most 4 - (k - 1) of them
    # both rules of the alarm report at the final validation (the smoke run is too short to fire either)
    assert metrics[f"val-core/{SOURCE}/reward/mean@1/regressed"] in (0.0, 1.0)
    assert metrics[f"val-core/{SOURCE}/reward/mean@1/below_start"] in (0.0, 1.0)
    # how many of the 4 greedy answers reached the smoke run's 8-token budget, and the budget rule's verdict on it
    clip = metrics[f"val-aux/{SOURCE}/response_length/clip_ratio"]
    assert clip in (0.0, 0.25, 0.5, 0.75, 1.0)
    assert metrics[f"val-aux/{SOURCE}/response_length/cut"] == float(clip >= 0.1)
    assert 0.0 <= metrics["actor/inert_rows_left_out"] <= 1.0


def test_kl_coef_adds_a_k3_kl_to_the_instruct_model():
    from rlhf.algos import KLLoss, kl_k3

    recipe = load_experiment("experiments/smollm2_tasks.py")
    off, _ = build_graph(recipe, ['config:base(task="arithmetic")'])
    on, _ = build_graph(recipe, ['config:base(task="arithmetic", kl_coef=0.05)'])
    assert off.stages["grpo"].policy.worker.objective.kl_loss is None
    assert off.stages["grpo"].policy.worker.ref_model_path is None
    kl = on.stages["grpo"].policy.worker.objective.kl_loss
    assert (fdl.get_callable(kl), kl.estimator, kl.coef) == (KLLoss, kl_k3, 0.05)
    assert on.stages["grpo"].policy.worker.ref_model_path == on.stages["grpo"].policy.worker.model_path


def test_sampling_rounds_screen_more_prompts_for_groups_with_a_signal():
    from rlhf.algos import DynamicSamplingAccumulator

    recipe = load_experiment("experiments/smollm2_tasks.py")
    default, _ = build_graph(recipe, ['config:base(task="arithmetic")'])
    two, _ = build_graph(recipe, ['config:base(task="arithmetic", sampling_rounds=2)'])
    rounds = two.stages["grpo"].dynamic_sampling
    assert (fdl.get_callable(rounds), rounds.max_attempts) == (DynamicSamplingAccumulator, 2)
    assert default.stages["grpo"].dynamic_sampling is None  # tried on the panel, no better: off by default
    # no KL and no entropy bonus: rows of groups that scored alike are left out of the update
    assert default.stages["grpo"].policy.worker.objective.kl_loss is None
    assert fdl.build(default.stages["grpo"].policy.worker.objective).skips_inert_rows


@pytest.mark.parametrize("with_val", [True, False])
def test_a_folders_validation_rows_are_its_val_file_or_else_its_test_rows(tmp_path, with_val):
    """A folder task validates on `val.parquet` when it has one, else on its test rows; the test stages always
    read `test.parquet`, and the test stage measures the RL stage's last weights."""
    from rlhf.data.sources import load_rows
    from rlhf.rewards.arithmetic import exact_match_score
    from rlhf.runtime.remote import StageOutput

    for split in ["train", "test"] + (["val"] if with_val else []):
        (tmp_path / f"{split}.parquet").touch()
    recipe = load_experiment("experiments/smollm2_tasks.py")
    graph = recipe.base(task=str(tmp_path), scorer=exact_match_score)
    val = graph.stages["grpo"].evaluator.dataset.rows
    assert fdl.get_callable(val) is load_rows
    assert val.path == str(tmp_path / ("val.parquet" if with_val else "test.parquet")) and val.limit == 100
    for stage in ("base", "test"):
        rows = graph.stages[stage].evaluator.dataset.rows
        assert (rows.path, rows.limit) == (str(tmp_path / "test.parquet"), 200)
    chosen = graph.stages["test"].policy.worker.model_path
    assert (fdl.get_callable(chosen), chosen.stage, chosen.key) == (StageOutput, "grpo", "checkpoint")
    assert list(graph.stages) == ["base", "grpo", "test"]


def test_generated_tasks_validate_on_rows_the_test_rows_never_share():
    """reasoning-gym and arithmetic: validation rows come from the training split with a seed of their own, the
    test rows from the test split (no question in both)."""
    recipe = load_experiment("experiments/smollm2_tasks.py")
    graph, _ = build_graph(recipe, ['config:base(task="arithmetic")'])
    val = fdl.build(graph.stages["grpo"].evaluator.dataset.rows)
    test = fdl.build(graph.stages["test"].evaluator.dataset.rows)
    assert (len(val), len(test)) == (100, 200)
    assert not {r["extra_info"]["question"] for r in val} & {r["extra_info"]["question"] for r in test}
    assert {r["extra_info"]["split"] for r in val} == {"train"} and {r["extra_info"]["split"] for r in test} == {"test"}
