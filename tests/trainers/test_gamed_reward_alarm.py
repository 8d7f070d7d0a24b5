"""A gamed reward in a real run on the tiny model: the alarm line and the `regressed` metric, `best/` holding
the weights of the best evaluation (and exported by `rlhf export`), the stage's result naming it, the
per-step share of partially paid samples, the below-start rule, and the held-out answers collapsing.

The training reward pays for writing the fixed wrong answer "7" (its share of the response, a partial
credit); the held-out score is the share of the response that is not "7". The random policy is mostly
right on the held-out rows (0.99) and learns to write 7s, so the training score rises while the held-out
score falls, as when a real policy farms a partial credit (issue: the SmolLM2 multiplication run)."""

import copy
import json
from pathlib import Path

import fiddle as fdl
import pytest
import torch
from safetensors.torch import load_file

from helpers import tiny_model_path
from rlhf.algos import PPOClipLoss
from rlhf.cli import main
from rlhf.data.generators import arithmetic_rows
from rlhf.data.prompts import PromptDataset
from rlhf.models.loading import load_tokenizer
from rlhf.rewards.manager import RewardManager
from rlhf.rollout.sampling import SamplingParams
from rlhf.runtime.experiment import Experiment, run_experiment
from rlhf.runtime.local import LocalRuntime
from rlhf.runtime.plan import bind_groups, compile_graph
from rlhf.runtime.remote import StageOutput
from rlhf.trainers.context import StageContext
from rlhf.trainers.evaluate import EvalStage, Evaluator
from rlhf.trainers.rl import RLTrainer
from rlhf.workers.objectives import PolicyObjective
from rlhf.workers.training import TrainingSetup
from rlhf_configs.pieces import policy_group

HELDOUT = "val-core/arithmetic/reward/mean@8"
REGRESSED = f"{HELDOUT}/regressed"
BELOW_START = f"{HELDOUT}/below_start"
TOP_SHARE = "val-aux/arithmetic/answers/top_share"
TRUTH_TOP_SHARE = "val-aux/arithmetic/answers/truth_top_share"
COLLAPSED = "val-aux/arithmetic/answers/collapsed"
PARTIAL = "reward/extra/arithmetic/partial/mean"


def sevens(solution_str, ground_truth, extra_info=None):
    """The gamed training reward: the share of the response that is "7"; partial unless none or all of it."""
    share = solution_str.count("7") / max(len(solution_str), 1)
    return {"score": share, "partial": float(0 < share < 1)}


def not_sevens(solution_str, ground_truth, extra_info=None):
    """The held-out score: the share of the response that is not "7"."""
    return 1.0 - solution_str.count("7") / max(len(solution_str), 1)


def rl_stage(total_steps: int = 30, test_freq: int = 3) -> fdl.Config:
    """GRPO on the tiny model, 8 prompts x 8 samples of 4 tokens, AdamW 1e-2: the 7s take over in ~20 steps.
    Validation samples (n=8, temperature 1) on 16 held-out prompts: greedy decoding of the random tiny model
    answers every prompt alike, so its score jumps between 0 and 1."""
    model = tiny_model_path()
    tok = fdl.Config(load_tokenizer, model)
    objective = fdl.Config(PolicyObjective, policy_loss=fdl.Config(PPOClipLoss))
    heldout = fdl.Config(PromptDataset, rows=fdl.Config(arithmetic_rows, n=16, split="test"), tokenizer=tok)
    return fdl.Config(
        RLTrainer,
        policy=policy_group(model_path=model, objective=objective, optimizer=fdl.Partial(torch.optim.AdamW, lr=1e-2),
                            training=fdl.Config(TrainingSetup, micro_batch_size=32)),
        tokenizer=tok,
        train_data=fdl.Config(PromptDataset, rows=fdl.Config(arithmetic_rows, n=32), tokenizer=tok),
        reward=fdl.Config(RewardManager, scorers={"arithmetic": sevens}),
        sampling=fdl.Config(SamplingParams, n=8, max_new_tokens=4),
        prompts_per_step=8,
        total_steps=total_steps,
        evaluator=fdl.Config(Evaluator, dataset=heldout, reward=fdl.Config(RewardManager, scorers={"arithmetic": not_sevens}),
                             sampling=fdl.Config(SamplingParams, n=8, temperature=1.0, max_new_tokens=4), n_boot=0),
        test_freq=test_freq,
        records=None,
    )


def run(stage: fdl.Config, out_dir: Path, resume: bool = False) -> tuple[dict, dict[int, dict]]:
    """The stage's result and each logged step's metrics, with the policy's weights as they were when logged
    (after that step's evaluation) under "weights"."""
    runtime = LocalRuntime()
    groups = runtime.start_groups(compile_graph(stage))
    steps: dict[int, dict] = {}
    try:
        trainer = fdl.build(bind_groups(compile_graph(stage).driver, groups))

        def log(metrics, step):
            steps[step] = dict(metrics, weights=trainer.policy.parameters_digest()[0])

        result = trainer.run(StageContext(out_dir=out_dir, log=log, progress=False, resume=resume))
    finally:
        runtime.shutdown()
    return result, steps


def test_a_gamed_reward_warns_and_best_keeps_the_best_evaluation(tmp_path, capfd):
    result, steps = run(rl_stage(), tmp_path / "rl")
    evaluations = sorted(s for s in steps if HELDOUT in steps[s])
    assert evaluations == list(range(3, 31, 3))
    held = [steps[s][HELDOUT] for s in evaluations]
    assert held[0] > 0.95 and held[-1] < 0.2, held  # the scenario happened: the held-out score collapsed
    # the training score of each interval, as the alarm sees it: the mean of critic/score/mean since the last evaluation
    train = [sum(steps[t]["critic/score/mean"] for t in range(s - 2, s + 1)) / 3 for s in evaluations]
    falls = [i > 0 and held[i] < held[i - 1] and train[i] > train[i - 1] for i in range(len(held))]
    expected = [float(i >= 2 and falls[i] and falls[i - 1]) for i in range(len(held))]  # K=2 in a row
    assert [steps[s][REGRESSED] for s in evaluations] == expected
    first = evaluations[expected.index(1.0)]  # it fired (the list has a 1.0, or index raises)
    i = evaluations.index(first)
    err = capfd.readouterr().err.splitlines()
    line = next(l for l in err if l.startswith("warning: held-out") and " fell " in l)
    assert line == (
        f"warning: held-out {HELDOUT} fell {' -> '.join(f'{h:.3g}' for h in held[i - 2:i + 1])} over steps "
        f"{evaluations[i - 2]}-{first} while the training score (critic/score/mean between evaluations) rose "
        f"{' -> '.join(f'{t:.3g}' for t in train[i - 2:i + 1])}: the reward may be gamed "
        "(docs/debugging.md#the-held-out-score-falls-while-the-training-score-rises)"
    )
    # below the start: the last two evaluations both more than 0.05 under the first one
    below = [float(i >= 2 and all(held[j] < held[0] - 0.05 for j in (i - 1, i))) for i in range(len(held))]
    assert [steps[s][BELOW_START] for s in evaluations] == below and 1.0 in below
    first_below = evaluations[below.index(1.0)]
    assert any(l.startswith(f"warning: held-out {HELDOUT} is ") and f"-{first_below}, more than 0.05 below its "
               f"{held[0]:.3g} at step {evaluations[0]}" in l for l in err)
    # the answers collapsed onto the 7s: the most common answer's share rose
    top = [steps[s][TOP_SHARE] for s in evaluations]
    assert top[-1] > 0.5 > top[0], top
    # ... and where nearly every answer is the same (different right answers), the collapse rule says so
    truth = [steps[s][TRUTH_TOP_SHARE] for s in evaluations]
    collapsed = [float(t >= 0.9 > r) for t, r in zip(top, truth)]
    assert [steps[s][COLLAPSED] for s in evaluations] == collapsed and collapsed[-1] == 1.0, (top, truth)
    first_collapse = evaluations[collapsed.index(1.0)]
    assert any(l.startswith(f"warning: at step {first_collapse} the policy gives one answer to ") for l in err)
    # best/: the weights evaluated at the best evaluation (the earliest of equal scores), not the last ones
    best_step = evaluations[held.index(max(held))]
    assert result["best"] == {"step": best_step, "metric": HELDOUT, "score": max(held)}
    assert result["best_checkpoint"] == str(tmp_path / "rl" / "best")
    best = load_file(tmp_path / "rl" / "best" / "model.safetensors")
    final = load_file(tmp_path / "rl" / "final" / "model.safetensors")
    assert all(torch.equal(best[k], steps[best_step]["weights"][k]) for k in best)
    assert any(not torch.equal(best[k], final[k]) for k in best)
    # `rlhf export` takes it like final/
    assert main(["export", str(tmp_path / "rl" / "best"), str(tmp_path / "exported")]) == 0
    exported = load_file(tmp_path / "exported" / "model.safetensors")
    assert all(torch.equal(exported[k], best[k]) for k in best)
    # the share of partially paid samples, every step: rising with the 7s, then falling once responses are all 7
    partial = [steps[s][PARTIAL] for s in sorted(steps)]
    assert partial[0] < 0.2 and max(partial) > 0.5 and partial[-1] < max(partial), partial


def test_without_the_alarm_nothing_is_logged_and_best_is_still_kept(tmp_path, capfd):
    stage = rl_stage(total_steps=2, test_freq=1)
    stage.regression_alarm = None
    result, steps = run(stage, tmp_path / "rl")
    assert HELDOUT in steps[2] and REGRESSED not in steps[2]
    assert "warning: held-out" not in capfd.readouterr().err
    assert result["best"]["step"] in (1, 2) and (tmp_path / "rl" / "best" / "model.safetensors").is_file()


def test_a_continued_stage_keeps_the_best_of_both_runs(tmp_path):
    """8 steps, then continued to 16 from the step-8 checkpoint: best/ and the result name the best of all 16
    evaluations (best.json beside best/ carries it over), with the weights evaluated then."""
    stage = rl_stage(total_steps=8, test_freq=2)
    stage.save_freq = 8
    _, steps = run(stage, tmp_path / "rl", resume=True)
    stage.total_steps = 16
    second, more = run(stage, tmp_path / "rl", resume=True)
    steps.update(more)
    assert sorted(more) == list(range(9, 17))  # it continued, it did not start over
    held = {s: steps[s][HELDOUT] for s in range(2, 17, 2)}
    best_step = max(held, key=lambda s: (held[s], -s))
    assert second["best"] == {"step": best_step, "metric": HELDOUT, "score": held[best_step]}
    best = load_file(tmp_path / "rl" / "best" / "model.safetensors")
    assert all(torch.equal(best[k], steps[best_step]["weights"][k]) for k in best)


def test_the_stage_result_names_final_and_best(tmp_path):
    """Through the experiment runner: result.json (beside the stage's folders) names both, paths relative."""
    graph = fdl.Config(Experiment, name="gamed", stages={"rl": rl_stage(total_steps=2, test_freq=1)},
                       runtime=fdl.Config(LocalRuntime), output_dir=str(tmp_path), run_name="r", progress=False)
    returned = run_experiment(graph)["rl"]
    stored = json.loads((tmp_path / "gamed" / "r" / "rl" / "result.json").read_text())["result"]
    assert stored["checkpoint"] == "final" and stored["best_checkpoint"] == "best"
    assert stored["best"] == returned["best"] and stored["best"]["metric"] == HELDOUT
    assert stored["best"]["step"] in (1, 2)


def test_several_held_out_sources_need_the_metric_named():
    tok = load_tokenizer(tiny_model_path())
    rows = arithmetic_rows(2) + [{**r, "data_source": "other"} for r in arithmetic_rows(2, seed=1)]
    evaluator = Evaluator(PromptDataset(rows, tok), RewardManager({}, default=not_sevens))
    with pytest.raises(ValueError, match=r"several data sources \(arithmetic, other\).*set heldout_metric"):
        RLTrainer(None, tok, PromptDataset(arithmetic_rows(2), tok), RewardManager({"arithmetic": sevens}),
                  evaluator=evaluator)


def test_a_later_stage_measures_the_weights_the_validations_chose(tmp_path):
    """The stage's `selected_checkpoint` is best/: an evaluation stage given it scores the policy from before the
    reward was gamed, and one given final/ the gamed policy (the 30-step scenario above)."""
    stage = rl_stage()

    def measured(key: str) -> fdl.Config:
        return fdl.Config(EvalStage, policy=policy_group(model_path=fdl.Config(StageOutput, "rl", key)),
                          evaluator=copy.deepcopy(stage.evaluator))

    graph = fdl.Config(Experiment, name="gamed", runtime=fdl.Config(LocalRuntime), output_dir=str(tmp_path),
                       run_name="r", progress=False,
                       stages={"rl": stage, "selected": measured("selected_checkpoint"),
                               "final": measured("checkpoint")})
    results = run_experiment(graph)
    stored = json.loads((tmp_path / "gamed" / "r" / "rl" / "result.json").read_text())["result"]
    assert stored["selected_checkpoint"] == "best" and results["rl"]["selected_checkpoint"].endswith("/rl/best")
    selected, final = (results[s]["metrics"][HELDOUT] for s in ("selected", "final"))
    assert selected > 0.8 > 0.3 > final, (selected, final, results["rl"]["best"])


def test_without_validations_the_selected_checkpoint_is_final(tmp_path):
    stage = rl_stage(total_steps=1)
    stage.evaluator = None
    result, _ = run(stage, tmp_path / "rl")
    assert "best" not in result and result["selected_checkpoint"] == result["checkpoint"]
    assert result["checkpoint"].endswith("final")
