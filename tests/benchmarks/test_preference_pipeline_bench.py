"""benchmarks/preference_pipeline.py's bookkeeping: the length-only check of the pairs and the verdict against the
issue's targets (the pipeline itself runs in tests/e2e/test_smollm2_rlhf.py on the real model)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import preference_pipeline  # noqa: E402


def pair(chosen: str, rejected: str) -> dict:
    return {"chosen": [{"role": "assistant", "content": chosen}], "rejected": [{"role": "assistant", "content": rejected}]}


def test_length_only_counts_ties_as_half():
    pairs = [pair("longer one", "short"), pair("a", "bb"), pair("same", "size"), pair("xyz", "no")]
    got = preference_pipeline.length_only_accuracy(pairs)
    # longer chosen: 1 + 0 + 0.5 + 1 = 2.5 of 4
    assert got == {"longer_is_chosen": 0.625, "shorter_is_chosen": 0.375, "tied_pairs": 1, "pairs": 4}
    assert preference_pipeline.length_only_accuracy([pair("ab", "c")])["longer_is_chosen"] == 1.0


def result(**fields) -> dict:
    base = {"rm_heldout_accuracy": 0.85, "gold_base": 0.6, "gold_rl_with_rm": 0.8, "gold_dpo": 0.72,
            "length_only_heldout_accuracy": {"longer_is_chosen": 0.45, "shorter_is_chosen": 0.55},
            "stage_minutes": {"rm": 12.0, "grpo": 15.0, "dpo": 9.0}}
    return {**base, **fields}


def test_verdict_checks_each_target():
    assert all(preference_pipeline.verdict(result()).values())
    failed = {
        "rm_accuracy_at_least_0.80": result(rm_heldout_accuracy=0.79),
        "rl_gold_gain_at_least_15_points": result(gold_rl_with_rm=0.74),
        "dpo_gold_gain_at_least_10_points": result(gold_dpo=0.69),
        "length_only_at_most_60pct": result(length_only_heldout_accuracy={"longer_is_chosen": 0.35,
                                                                          "shorter_is_chosen": 0.65}),
        "every_stage_within_20_min": result(stage_minutes={"rm": 20.5}),
    }
    for name, bad in failed.items():
        verdict = preference_pipeline.verdict(bad)
        assert not verdict[name] and all(v for k, v in verdict.items() if k != name), name


def test_threads_reach_every_stage_and_the_dpo_loss_its_stage():
    import fiddle as fdl
    from fiddle import selectors

    from rlhf.algos.preference import PreferenceLoss, RPOLoss
    from rlhf.cli.experiment import build_graph, load_experiment
    from rlhf.runtime.plan import compile_graph

    recipe = load_experiment(str(Path(preference_pipeline.ROOT) / "experiments" / "smollm2_rlhf.py"))
    graph, _ = build_graph(recipe, preference_pipeline.graph_commands('dpo_loss="rpo"', threads=2))
    assert {name: {g.cpus_per_worker for g in compile_graph(stage).groups.values()}
            for name, stage in graph.stages.items()} == {name: {2} for name in graph.stages}
    losses = list(selectors.select(graph.stages["dpo"], PreferenceLoss))
    assert [(fdl.get_callable(l), l.beta) for l in losses] == [(RPOLoss, 0.1)]
