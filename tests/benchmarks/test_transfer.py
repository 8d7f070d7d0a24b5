"""benchmarks/transfer.py's bookkeeping: task specs, Wilson intervals, the verdict against the issue's targets."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import transfer  # noqa: E402


def test_task_specs_carry_settings_as_json():
    assert transfer.parse_task("arithmetic") == ("arithmetic", {})
    assert transfer.parse_task('reasoning_gym/chain_sum={"max_terms": 2}') == ("reasoning_gym/chain_sum",
                                                                                {"max_terms": 2})
    assert all(transfer.parse_task(spec)[0] for spec in transfer.PANEL)
    assert len(transfer.PANEL) >= 8 and sum(s.startswith("reasoning_gym/") for s in transfer.PANEL) >= 6


def test_task_lists_split_outside_the_settings_braces():
    assert transfer.split_specs('reasoning_gym/letter_counting={"min_words": 3, "max_words": 5},arithmetic') == [
        'reasoning_gym/letter_counting={"min_words": 3, "max_words": 5}', "arithmetic"]
    assert transfer.split_specs("a; b;") == ["a", "b"]
    assert [transfer.parse_task(s) for s in transfer.split_specs(",".join(transfer.PANEL))] == \
        [transfer.parse_task(s) for s in transfer.PANEL]


def test_wilson_interval_hand_computed():
    # p = 0.5, n = 200: centre 0.5, half-width 1.96 * sqrt(0.25/200 + 1.96^2/160000) / (1 + 1.96^2/200)
    #   = 1.96 * 0.035693 / 1.019208 = 0.0686
    assert transfer.wilson(0.5, 200) == pytest.approx([0.4314, 0.5686], abs=1e-4)
    low, high = transfer.wilson(0.0, 200)
    assert low == 0.0 and high == pytest.approx(0.0188, abs=1e-4)  # never a negative or empty interval at 0


def row(base, trained, lenient):
    return {"base_accuracy": base, "trained_accuracy": trained, "base_lenient": lenient, "gain": trained - base}


def test_verdict_checks_each_target_separately():
    good = transfer.verdict([row(0.0, 0.3, 0.2), row(0.1, 0.3, 0.25)])
    assert good["every_task_gains_10_points"] and good["none_below_base_lenient"] and good["mean_gain_15_points"]
    below = transfer.verdict([row(0.0, 0.15, 0.2), row(0.0, 0.4, 0.1)])  # gains 15 and 40, but one below its lenient
    assert below["every_task_gains_10_points"] and not below["none_below_base_lenient"]
    small = transfer.verdict([row(0.0, 0.05, 0.0), row(0.0, 0.5, 0.0)])
    assert not small["every_task_gains_10_points"] and small["mean_gain_15_points"]
    collapsed = transfer.verdict([row(0.0, 0.3, 0.2), {**row(0.5, 0.6, 0.5), "task": "letters", "collapsed": True}])
    assert not collapsed["every_task_gains_10_points"] and collapsed["collapsed_tasks"] == ["letters"]
    assert good["collapsed_tasks"] == []
    explained = transfer.verdict([{**row(0.5, 0.5, 0.5), "task": "flat", "shortfall": {"why_not": ["no change"]}},
                                  {**row(0.0, 0.3, 0.2), "task": "fine", "shortfall": {"why_not": []}}])
    assert explained["why_not"] == {"flat": ["no change"]} and good["why_not"] == {}
    failed = transfer.verdict([{"task": "x", "error": ["boom"]}])
    assert failed["tasks_failed"] == 1 and not failed["every_task_gains_10_points"]


def test_the_seed_reaches_the_training_stage_and_leaves_the_rows(tmp_path):
    graphs = [transfer.panel_graph("reasoning_gym/gcd", {"max_value": 20}, 3, tmp_path, seed=seed) for seed in (0, 7)]
    assert [g.stages["grpo"].seed for g in graphs] == [0, 7]
    assert graphs[0].stages["grpo"].total_steps == 3
    for part in ("train_data", "evaluator"):  # the same rows for every seed: the spread is the training's
        assert repr(getattr(graphs[0].stages["grpo"], part)) == repr(getattr(graphs[1].stages["grpo"], part))


def test_set_overrides_reach_the_graph_after_the_seed(tmp_path):
    graph = transfer.panel_graph("reasoning_gym/gcd", {}, 3, tmp_path, seed=1,
                                 overrides=("set:stages.grpo.prompts_per_step=16", "set:stages.grpo.sampling.n=4"))
    assert (graph.stages["grpo"].prompts_per_step, graph.stages["grpo"].sampling.n, graph.stages["grpo"].seed) == (16, 4, 1)


def test_the_panel_runs_the_recipes_own_step_count_by_default(tmp_path):
    graph = transfer.panel_graph("reasoning_gym/gcd", {}, transfer.recipe_steps(), tmp_path)
    assert graph.stages["grpo"].total_steps == transfer.load_recipe().base().stages["grpo"].total_steps


@pytest.mark.parametrize("recipe_args", [", steps=32", ",steps =32", ", task='x'", ", settings={}"])
def test_recipe_args_may_not_set_what_the_panel_records_itself(monkeypatch, capsys, recipe_args):
    # `--recipe-args ", steps=32"` once ran 32 steps while the JSON said 16
    monkeypatch.setattr(sys, "argv", ["transfer.py", "--recipe-args", recipe_args])
    with pytest.raises(SystemExit):
        transfer.main()
    assert "sets an argument the panel sets itself (task, settings, steps): use --tasks or --steps" in \
        capsys.readouterr().err


def test_the_recipe_refuses_an_argument_given_twice(tmp_path):
    from rlhf.config.overrides import OverrideError
    with pytest.raises(OverrideError, match="argument 'steps' given more than once"):
        transfer.panel_graph("reasoning_gym/gcd", {}, 3, tmp_path, recipe_args=", steps=4")


@pytest.mark.parametrize("minutes", [None, transfer.TRAIN_MINUTES, 0.5])
def test_the_training_budget_reaches_the_stage(tmp_path, minutes):
    graph = transfer.panel_graph("reasoning_gym/gcd", {}, 3, tmp_path, minutes=minutes)
    assert graph.stages["grpo"].max_train_minutes == minutes


def spread(top, truth, accuracy=None, step=10):
    return {"step": step, "accuracy": accuracy, "top_share": top, "truth_top_share": truth}


def judged(base, trained, lenient=None, trained_lenient=None, validations=None, collapsed=False):
    r = {**row(base, trained, base if lenient is None else lenient), "heldout_rows": 200, "collapsed": collapsed,
         "trained_lenient": trained if trained_lenient is None else trained_lenient,
         "validations": validations if validations is not None else [spread(0.2, 0.1, trained)]}
    return transfer.shortfall(r)


@pytest.mark.parametrize("case, why, caveat", [
    # a gain of 20 points, answers spread out: met
    (dict(base=0.1, trained=0.3), [], []),
    # one answer to all 200 questions, right for 60%: collapsed, whatever the gain
    (dict(base=0.5, trained=0.6, validations=[spread(1.0, 0.6, 0.6)]), ["collapsed"], []),
    # the flag alone (the run's alarm) also counts
    (dict(base=0.5, trained=0.6, collapsed=True), ["collapsed"], []),
    # strict 0 but right format aside in 65.5%: the form was not learnt (and no measurable change)
    (dict(base=0.0, trained=0.0, lenient=0.06, trained_lenient=0.655), ["below the base", "form not learnt",
                                                                       "no measurable change"], []),
    # 10.5% -> 9%: inside the base's interval (6.9%-15.6%); and below its 13% lenient
    (dict(base=0.105, trained=0.09, lenient=0.13), ["below the base", "no measurable change"], []),
    # 30.5% -> 16%: below the base's interval
    (dict(base=0.305, trained=0.16, lenient=0.1), ["fell"], []),
    # +7 points, past the base's interval (6.9%-15.6% at 10.5%) but below 10
    (dict(base=0.105, trained=0.175), ["small gain"], []),
    # +26.5 points to 57%, where 58% of the answers are one answer that is right 57% of the time
    (dict(base=0.305, trained=0.57, validations=[spread(0.58, 0.57, 0.57)]), [], ["most common right answer"]),
    # met, but the best validation (step 5, 52%) is 12 points above the last
    (dict(base=0.05, trained=0.40, validations=[spread(0.2, 0.1, 0.05, 0), spread(0.2, 0.1, 0.52, 5),
                                                spread(0.2, 0.1, 0.40, 10)]), [], ["best validation at step 5"]),
    # a run from before the answer spread was recorded: no collapse can be ruled out
    (dict(base=0.5, trained=0.6, validations=[{"step": 10, "accuracy": 0.6}]), [], ["not recorded"]),
])
def test_shortfall_names_each_way_a_task_misses_the_targets(case, why, caveat):
    got = judged(**case)
    assert got["met"] == (not why)
    assert len(got["why_not"]) == len(why) and all(w in g for w, g in zip(why, got["why_not"])), got["why_not"]
    assert len(got["caveats"]) == len(caveat) and all(c in g for c, g in zip(caveat, got["caveats"])), got["caveats"]


def test_the_summary_groups_seeds_replaces_reruns_and_keeps_other_tasks_out_of_the_means(tmp_path):
    """Two seeds of a two-task panel: seed 0 in two files (the second reruns task b), seed 1 in one, and a task
    outside the panel beside seed 0; per task the gains per seed, their mean and range, and the seeds that met the
    target; per seed the mean gain over the panel only."""
    import transfer_summary

    def task(name, base, trained, top=0.2):
        return {"task": name, "base_accuracy": base, "trained_accuracy": trained, "base_lenient": base,
                "trained_lenient": trained, "gain": round(trained - base, 4), "heldout_rows": 200,
                "validations": [spread(top, 0.1, trained)]}

    files = {
        "s0.json": {"seed": 0, "steps": 10, "recipe": "r", "tasks": [task("a", 0.1, 0.4), task("b", 0.5, 0.5),
                                                                   task("held", 0.2, 0.3)]},
        "s0-rerun.json": {"seed": 0, "steps": 10, "recipe": "r", "tasks": [task("b", 0.5, 0.6, top=1.0)]},
        "s1.json": {"seed": 1, "steps": 10, "recipe": "r", "tasks": [task("a", 0.1, 0.15), task("b", 0.5, 0.7),
                                                                   {"task": "c", "error": ["boom"]}]},
    }
    for name, run in files.items():
        (tmp_path / name).write_text(json.dumps(run))
    name, runs = transfer_summary.load("v=" + ",".join(str(tmp_path / f) for f in files))
    v = transfer_summary.variant_summary(name, runs, panel=["a", "b"])
    assert v["seeds"] == [0, 1] and list(v["tasks"]) == ["a", "b"]
    assert v["tasks"]["a"]["gains"] == {0: 0.3, 1: 0.05} and v["tasks"]["a"]["gain_range"] == [0.05, 0.3]
    assert v["tasks"]["b"]["gains"] == {0: 0.1, 1: 0.2}  # the rerun replaced seed 0's first row of b
    assert v["tasks"]["a"]["met_in_seeds"] == 1 and "small gain" in v["tasks"]["a"]["why_not"][1][0]
    assert v["tasks"]["b"]["met_in_seeds"] == 1 and v["tasks"]["b"]["why_not"][0][0].startswith("collapsed")
    assert v["mean_gain_per_seed"] == {0: 0.2, 1: 0.125} and v["mean_gain"] == 0.1625
    assert v["tasks_meeting_target_per_seed"] == {0: 1, 1: 1} and v["mean_gain_target_met_in_seeds"] == 1
    assert v["other_tasks"] == {0: {"held": {"gain": 0.1, "base_accuracy": 0.2, "trained_accuracy": 0.3,
                                             "met": True, "why_not": [], "caveats": []}}}
    assert "| a | 10.0% | +30.0 | +5.0 | +17.5 | 1/2 |" in transfer_summary.markdown(v)
    with pytest.raises(SystemExit, match="no such file"):
        transfer_summary.load("v=missing.json")


def test_the_summary_reads_runs_with_the_test_stage_on_either_weights(tmp_path):
    """Runs with the test stage measured the last weights and the validation-chosen ones on the same test rows, in
    two layouts (the chosen ones first with `final_*` beside them, or the last first with `chosen_*`): FILE@last
    and FILE@chosen read either layout on those weights (gain, collapse, answer spread); a file without a suffix,
    or an older run without the other figures, is read as it is."""
    import transfer_summary

    common = {"task": "a", "base_accuracy": 0.3, "base_lenient": 0.3, "heldout_rows": 200, "selected_step": 4}
    chosen = {"accuracy": 0.45, "lenient": 0.5, "gain": 0.15, "collapsed": False,
              "answers": {"top_share": 0.2, "truth_top_share": 0.1}}
    last = {"accuracy": 0.6, "lenient": 0.6, "gain": 0.3, "collapsed": True,
            "answers": {"top_share": 1.0, "truth_top_share": 0.6}}

    def row(first, other, prefix):
        return {**common, "trained_accuracy": first["accuracy"], "trained_lenient": first["lenient"],
                "gain": first["gain"], "collapsed": first["collapsed"], "answers": first["answers"],
                **{f"{prefix}_{k}": v for k, v in other.items()}}

    (tmp_path / "chosen_first.json").write_text(json.dumps({"seed": 4, "tasks": [row(chosen, last, "final")]}))
    (tmp_path / "last_first.json").write_text(json.dumps({"seed": 4, "tasks": [row(last, chosen, "chosen")]}))
    for file in ("chosen_first.json", "last_first.json"):
        for weights, gain, met in (("chosen", 0.15, 1), ("last", 0.3, 0)):
            v = transfer_summary.variant_summary(*transfer_summary.load(f"v={tmp_path / file}@{weights}"), panel=["a"])
            assert v["tasks"]["a"]["gains"] == {4: gain} and v["tasks"]["a"]["met_in_seeds"] == met, (file, weights)
            if weights == "last":
                assert v["tasks"]["a"]["why_not"][4][0].startswith("collapsed: one answer to 100%")
    as_is = transfer_summary.variant_summary(*transfer_summary.load(f"v={tmp_path / 'last_first.json'}"), panel=["a"])
    assert as_is["tasks"]["a"]["gains"] == {4: 0.3}
    (tmp_path / "old.json").write_text(json.dumps({"seed": 0, "tasks": [{**common, **row(last, {}, "x")}]}))
    old = transfer_summary.variant_summary(*transfer_summary.load(f"v={tmp_path / 'old.json'}@chosen"), panel=["a"])
    assert old["tasks"]["a"]["gains"] == {0: 0.3}
    with pytest.raises(SystemExit, match="expected @last or @chosen"):
        transfer_summary.variant_summary(*transfer_summary.load(f"v={tmp_path / 'old.json'}@best"), panel=["a"])
