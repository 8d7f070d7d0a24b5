"""benchmarks/distillation.py's bookkeeping: minutes to 90% of the teacher, each method's entry, the verdict."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import distillation  # noqa: E402

CURVE = [{"step": 4, "minutes": 5.0, "lenient": 0.30}, {"step": 8, "minutes": 10.0, "lenient": 0.55},
         {"step": 12, "minutes": 15.0, "lenient": 0.50}]


def test_minutes_to_the_first_validation_at_or_above_the_threshold():
    assert distillation.minutes_to(CURVE, "lenient", 0.55) == 10.0  # at, not only above
    assert distillation.minutes_to(CURVE, "lenient", 0.54) == 10.0  # the first, though a later one falls
    assert distillation.minutes_to(CURVE, "lenient", 0.6) is None
    assert distillation.minutes_to(CURVE, "strict", 0.1) is None  # a metric the curve lacks never reaches it


def test_each_method_starts_at_the_base_accuracy_at_minute_zero():
    # teacher 0.6 -> 90% of it is 0.54: reached at 10 minutes; the final validation is the last point
    entry = distillation.summarise("opd", {"curve": CURVE}, "lenient", teacher_accuracy=0.6, base_accuracy=0.06)
    assert entry["curve"][0] == {"step": 0, "minutes": 0.0, "lenient": 0.06}
    assert entry["final_accuracy"] == 0.50 and entry["minutes_to_90pct_teacher"] == 10.0
    failed = {"error": ["boom"], "log": "x.log"}
    assert distillation.summarise("sft", failed, "lenient", 0.6, 0.06) == failed


def entry(minutes):
    return {"minutes_to_90pct_teacher": minutes}


def test_verdict_against_the_target():
    assert distillation.verdict({"opd": entry(10.0), "grpo": entry(30.0)}, 0.6, 0.06)["met"]  # exactly a third
    assert not distillation.verdict({"opd": entry(10.1), "grpo": entry(30.0)}, 0.6, 0.06)["met"]
    assert distillation.verdict({"opd": entry(10.0), "grpo": entry(None)}, 0.6, 0.06)["met"]  # GRPO never did
    assert not distillation.verdict({"opd": entry(None), "grpo": entry(None)}, 0.6, 0.06)["met"]
    assert not distillation.verdict({"opd": entry(5.0), "grpo": {"error": ["x"]}}, 0.6, 0.06)["met"]  # no GRPO run
    # a student already at 90% of its teacher: nothing to compare
    same = distillation.verdict({"opd": entry(0.0), "grpo": entry(0.0)}, 0.0, 0.0)
    assert same["met"] is None and "nothing to compare" in same["note"]


def test_the_repetition_options_reach_the_students_stages():
    """--seed sets both students' prompt order and sampling (not the teacher's); --opd-samples and --top-k change
    OPD's answers per prompt and add the top-k forward KL; without them each recipe keeps its own."""
    import argparse

    def args(**kw):
        base = dict(quick=False, student=None, metric="strict", teacher_steps=10, opd_steps=6, opd_lr=2e-5,
                    distill_coef=1.0, opd_samples=None, top_k=None, grpo_steps=10, grpo_lr=2e-5, sft_steps=48,
                    sft_batch=16, sft_lr=2e-5, sft_prompts=512, sft_temperature=0.0, eval_every=1, seed=0)
        return distillation.settings(argparse.Namespace(**{**base, **kw}))

    s = args(seed=3, opd_samples=2, top_k=8)
    opd = distillation.rl_stage("opd", s, "student", "teacher")
    assert opd.seed == 3 and opd.sampling.n == 2 and opd.policy.worker.objective.distill_loss.k == 8
    assert distillation.rl_stage("opd", args(top_k=0), "student", "teacher").policy.worker.objective.distill_loss \
        is None
    assert distillation.rl_stage("grpo", s, "student", None).seed == 3
    assert distillation.rl_stage("teacher", s, "student", None).seed == 0
    shipped = distillation.rl_stage("opd", args(), "student", "teacher")
    assert shipped.sampling.n == s["sampling"]["n_per_method"]["grpo"] // 2 == 4  # the recipe's own
    assert shipped.policy.worker.objective.distill_loss.k == 16  # the recipe's default
