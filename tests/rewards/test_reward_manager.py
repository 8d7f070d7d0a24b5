"""RewardManager: dispatch, extras, unknown sources, strict vs fallback, batched scorers, overlong shaping."""

import functools
import logging
import math

import pytest

from rlhf.data import arithmetic_rows, countdown_rows, ground_truth, gsm8k_like_rows
from rlhf.rewards import (
    Batched,
    RewardManager,
    RewardOutput,
    ScorerError,
    UnknownDataSourceError,
    countdown_score,
    default_scorers,
    exact_match_score,
    gsm8k_score,
)


def half(solution_str, ground_truth, extra_info=None):
    return 0.5


def with_extras(solution_str, ground_truth, extra_info=None):
    return {"score": float(solution_str == ground_truth), "length": len(solution_str)}


def boom(solution_str, ground_truth, extra_info=None):
    raise RuntimeError("scorer exploded")


def call(manager, responses, sources, truths=None, extras=None):
    n = len(responses)
    return manager(responses, sources, truths or ["1"] * n, extras or [None] * n)


def test_dispatches_each_row_to_its_source_scorer():
    manager = RewardManager({"a": exact_match_score, "b": half})
    out = call(manager, ["1", "2", "1", "x"], ["a", "a", "b", "b"])
    assert isinstance(out, RewardOutput)
    assert out.scores == [1.0, 0.0, 0.5, 0.5]
    assert out.extras == {}
    assert out.metrics == {"reward/errors": 0.0}


def test_scorer_gets_response_ground_truth_and_extra_info():
    seen = []

    def spy(solution_str, ground_truth, extra_info=None):
        seen.append((solution_str, ground_truth, extra_info))
        return 1

    call(RewardManager({"s": spy}), ["r0", "r1"], ["s", "s"], ["g0", "g1"], [{"i": 0}, None])
    assert seen == [("r0", "g0", {"i": 0}), ("r1", "g1", None)]


def test_dict_results_become_extras_columns():
    manager = RewardManager({"x": with_extras, "h": half})
    out = call(manager, ["1", "22", "1"], ["x", "x", "h"])
    assert out.scores == [1.0, 0.0, 0.5]
    assert out.extras == {"length": [1, 2, None]}  # None where the scorer did not report it


def test_numeric_extras_are_averaged_per_source_as_metrics(caplog):
    """reward/extra/<source>/<name>/mean over the rows of the source that reported a finite number."""
    answers = iter([{"score": 0.2, "partial": 1}, {"score": 1.0, "partial": 0}, {"score": 0.5, "partial": True},
                    {"score": 0.0, "partial": float("nan"), "note": "text"}, 0.3])

    def scripted(solution_str, ground_truth, extra_info=None):
        return next(answers)

    out = call(RewardManager({"a": scripted, "b/c": scripted, "d": boom}, strict=False),
               ["r"] * 6, ["a", "a", "b/c", "b/c", "a", "d"])
    assert out.metrics["reward/extra/a/partial/mean"] == 0.5  # (1 + 0) / 2: the plain 0.3 reported nothing
    assert out.metrics["reward/extra/b/c/partial/mean"] == 1.0  # True counts 1; the NaN row is left out (counted)
    assert out.metrics["reward/extra_nonfinite/partial"] == 1.0
    assert not any(k.startswith(("reward/extra/d/", "reward/extra/b/c/note")) for k in out.metrics)  # failed; text


def test_options_are_bound_with_partial():
    manager = RewardManager({"openai/gsm8k": functools.partial(gsm8k_score, format_score=0.25)})
    assert call(manager, ["#### 2", "#### 1"], ["openai/gsm8k"] * 2).scores == [0.25, 1.0]


def test_unknown_source_names_it_and_the_known_ones_before_scoring():
    calls = []

    def counting(solution_str, ground_truth, extra_info=None):
        calls.append(1)
        return 1.0

    manager = RewardManager({"arithmetic": counting, "countdown": counting})
    with pytest.raises(UnknownDataSourceError) as info:
        call(manager, ["1", "1"], ["arithmetic", "openai/gsm8k"])
    message = str(info.value)
    assert "'openai/gsm8k'" in message and "'arithmetic', 'countdown'" in message and "Fix:" in message
    assert calls == []  # nothing was scored


def test_check_sources_before_training():
    manager = RewardManager(default_scorers())
    rows = arithmetic_rows(3) + gsm8k_like_rows(3) + countdown_rows(3)
    manager.check_sources(r["data_source"] for r in rows)
    with pytest.raises(UnknownDataSourceError, match="'my/task'"):
        manager.check_sources(["arithmetic", "my/task"])
    with pytest.raises(ValueError):  # callers that catch ValueError (bad input) catch it too
        manager.check_sources(["my/task"])


def test_strict_reraises_with_row_and_source():
    manager = RewardManager({"ok": half, "bad": boom})
    with pytest.raises(ScorerError, match=r"data_source 'bad' failed on row 2: RuntimeError: scorer exploded") as info:
        call(manager, ["a", "b", "c"], ["ok", "ok", "bad"])
    assert isinstance(info.value.__cause__, RuntimeError)
    assert "strict=False" in str(info.value)


def test_non_strict_falls_back_and_counts_errors(caplog):
    manager = RewardManager({"ok": half, "bad": boom}, strict=False, fallback_score=-1.0)
    with caplog.at_level(logging.WARNING):
        out = call(manager, ["a", "b", "c", "d"], ["bad", "ok", "bad", "ok"])
    assert out.scores == [-1.0, 0.5, -1.0, 0.5]
    assert out.metrics == {"reward/errors": 2.0, "reward/errors/bad": 2.0}
    assert "2 reward scorer failure(s)" in caplog.text and "row 0" in caplog.text


def test_fallback_default_is_zero():
    out = call(RewardManager({"bad": boom}, strict=False), ["a"], ["bad"])
    assert out.scores == [0.0] and out.metrics["reward/errors"] == 1.0


@pytest.mark.parametrize(
    "result, problem",
    [
        (None, "returned NoneType None, not a number"),
        ("1.0", "returned str '1.0', not a number"),
        ({"value": 1.0}, "without a 'score' key"),
        (math.nan, "non-finite score"),
        ({"score": math.inf}, "non-finite score"),
    ],
)
def test_results_that_are_not_scores(result, problem):
    def scorer(solution_str, ground_truth, extra_info=None):
        return result

    with pytest.raises(ScorerError, match=problem):
        call(RewardManager({"s": scorer}), ["a"], ["s"])
    out = call(RewardManager({"s": scorer}, strict=False), ["a"], ["s"])
    assert out.scores == [0.0] and out.metrics["reward/errors"] == 1.0


def test_numpy_and_bool_scores_are_floats():
    import numpy as np

    manager = RewardManager({"np": lambda *a: np.float32(0.25), "b": lambda *a: True})
    out = call(manager, ["a", "b"], ["np", "b"])
    assert out.scores == [0.25, 1.0] and all(type(s) is float for s in out.scores)


def test_length_mismatch_and_non_callable_scorer():
    with pytest.raises(ValueError, match="disagree on the number of rows"):
        RewardManager({"a": half})(["x", "y"], ["a"], ["1", "1"], [None, None])
    with pytest.raises(TypeError, match="scorer for data_source 'a' is not callable"):
        RewardManager({"a": "exact_match"})


def test_empty_batch():
    out = RewardManager({})([], [], [], [])
    assert out.scores == [] and out.metrics == {"reward/errors": 0.0}


def test_default_scorers_cover_generators_and_verl_names():
    scorers = default_scorers()
    verl_names = {"openai/gsm8k", "lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval"}
    assert verl_names | {"countdown", "arithmetic"} <= set(scorers)
    assert scorers is not default_scorers()  # a fresh dict: users may change their copy
    assert scorers["countdown"] is countdown_score


def test_generated_rows_with_reference_answers_score_one():
    rows = arithmetic_rows(5) + gsm8k_like_rows(5) + countdown_rows(5)
    responses = []
    for row in rows:
        info = row["extra_info"]
        responses.append(f"<answer>{info['solution']}</answer>" if "solution" in info else info["answer"])
    out = RewardManager(default_scorers())(
        responses, [r["data_source"] for r in rows], [ground_truth(r) for r in rows], [r["extra_info"] for r in rows]
    )
    assert out.scores == [1.0] * 15


# ------------------------------------------------------------------------ batched scorers


def test_batched_scorer_gets_all_rows_of_its_source_in_one_call():
    calls = []

    def lengths(responses, ground_truths, extra_infos):
        calls.append((list(responses), list(ground_truths), list(extra_infos)))
        return [float(len(r)) for r in responses[:-1]] + [{"score": 9.0, "note": "last"}]

    manager = RewardManager({"b": Batched(lengths), "a": exact_match_score})
    out = manager(["x", "1", "yyy", "zz"], ["b", "a", "b", "b"], ["g0", "1", "g2", "g3"], [None, None, {"i": 2}, None])
    assert calls == [(["x", "yyy", "zz"], ["g0", "g2", "g3"], [None, {"i": 2}, None])]
    assert out.scores == [1.0, 1.0, 3.0, 9.0]
    assert out.extras == {"note": [None, None, None, "last"]}


def test_any_object_with_batched_true_is_batched():
    class ModelReward:
        batched = True

        def __call__(self, responses, ground_truths, extra_infos):
            return [0.5] * len(responses)

    assert call(RewardManager({"m": ModelReward()}), ["a", "b"], ["m", "m"]).scores == [0.5, 0.5]
    assert repr(Batched(exact_match_score)) == "Batched('exact_match_score')"


def test_batched_failures_mark_every_row_of_the_call():
    def wrong_length(responses, ground_truths, extra_infos):
        return [1.0]

    def explodes(responses, ground_truths, extra_infos):
        raise RuntimeError("model out of memory")

    manager = RewardManager({"w": Batched(wrong_length), "e": Batched(explodes), "a": half}, strict=False)
    out = call(manager, ["a", "b", "c", "d"], ["w", "a", "w", "e"])
    assert out.scores == [0.0, 0.5, 0.0, 0.0]
    assert out.metrics == {"reward/errors": 3.0, "reward/errors/w": 2.0, "reward/errors/e": 1.0}
    with pytest.raises(ScorerError, match=r"data_source 'w' failed on row 0: ValueError: batched scorer returned 1"):
        call(RewardManager({"w": Batched(wrong_length)}), ["a", "b"], ["w", "w"])


def test_batched_scorers_stay_in_process_with_workers():
    def local(responses, ground_truths, extra_infos):  # not picklable, and need not be
        return [2.0] * len(responses)

    manager = RewardManager({"m": Batched(local)}, num_workers=1)
    assert call(manager, ["a"], ["m"]).scores == [2.0]
    assert manager._pool is None  # no worker was needed


# --------------------------------------------------------------------- overlong shaping


def test_manager_adds_overlong_penalty_and_reports_it():
    manager = RewardManager({"a": exact_match_score}, overlong_buffer_len=4)
    out = manager(["1", "1", "2"], ["a"] * 3, ["1"] * 3, [None] * 3, response_lengths=[3, 8, 10], max_new_tokens=10)
    # lengths 3, 8, 10 with the buffer starting after 6 tokens: 0, -(8-6)/4 = -0.5, -1.
    assert out.scores == [1.0, 0.5, -1.0]
    assert out.extras == {"overlong_penalty": [0.0, -0.5, -1.0]}
    assert out.metrics["reward/overlong_penalty/mean"] == pytest.approx(-0.5)
    # the ramp follows the limit the responses were generated under: with 16, it starts after 12 tokens
    assert manager(["1"], ["a"], ["1"], [None], response_lengths=[10], max_new_tokens=16).scores == [1.0]


def test_overlong_options_are_checked():
    with pytest.raises(ValueError, match=r"RewardManager.overlong_buffer_len = 0: expects int > 0 \| None"):
        RewardManager({}, overlong_buffer_len=0)
    manager = RewardManager({"a": exact_match_score}, overlong_buffer_len=4)
    with pytest.raises(ValueError, match=r"overlong_buffer_len=4 is longer than .*max_new_tokens=3"):
        manager.check_generation_limit(3)
    manager.check_generation_limit(4)
    with pytest.raises(ValueError, match="needs response_lengths.*response_mask.sum"):
        manager(["1"], ["a"], ["1"], [None], max_new_tokens=10)
    with pytest.raises(ValueError, match=r"needs max_new_tokens.*batch.meta\['max_new_tokens'\]"):
        manager(["1"], ["a"], ["1"], [None], response_lengths=[1])
    with pytest.raises(ValueError, match=r"max_new_tokens=3"):
        manager(["1"], ["a"], ["1"], [None], response_lengths=[1], max_new_tokens=3)
    with pytest.raises(ValueError, match="disagree on the number of rows"):
        manager(["1"], ["a"], ["1"], [None], response_lengths=[1, 2], max_new_tokens=10)
    # without shaping, lengths and the limit are accepted and ignored
    plain = RewardManager({"a": exact_match_score})
    plain.check_generation_limit(1)
    out = plain(["1"], ["a"], ["1"], [None], response_lengths=[99], max_new_tokens=8)
    assert out.metrics == {"reward/errors": 0.0}


def test_bad_parallel_options():
    # each range is the marker in RewardManager's signature, read by the checker preflight uses too
    with pytest.raises(ValueError, match=r"^RewardManager.num_workers = -1: expects int >= 0$"):
        RewardManager({}, num_workers=-1)
    with pytest.raises(ValueError, match=r"^RewardManager.num_workers = 1.5: expects int >= 0$"):
        RewardManager({}, num_workers=1.5)
    with pytest.raises(ValueError, match=r"^RewardManager.timeout_s = 0: expects float > 0 \| None$"):
        RewardManager({}, num_workers=1, timeout_s=0)
    with pytest.raises(ValueError, match=r"^RewardManager.chunk_size = 0: expects int > 0 \| None$"):
        RewardManager({}, num_workers=1, chunk_size=0)
    with pytest.raises(ValueError, match=r"num_workers = -1: .*; RewardManager.chunk_size = 0"):  # every bad one
        RewardManager({}, num_workers=-1, chunk_size=0)


def test_a_default_scorer_takes_every_source_the_dict_does_not_name():
    manager = RewardManager({"arithmetic": exact_match_score}, default=half)
    manager.check_sources(["arithmetic", "my/task", "other"])  # nothing unknown with a default
    out = call(manager, ["1", "1", "x"], ["arithmetic", "my/task", "other"])
    assert out.scores == [1.0, 0.5, 0.5]
    everywhere = RewardManager({}, default=with_extras)  # what `rlhf eval --scorer module:function` builds
    out = call(everywhere, ["1", "22"], ["arithmetic", "openai/gsm8k"], truths=["1", "1"])
    assert out.scores == [1.0, 0.0] and out.extras == {"length": [1, 2]}
    with pytest.raises(TypeError, match="default scorer is not callable"):
        RewardManager({}, default="not a function")


def test_a_default_scorer_runs_in_worker_processes_too():
    from worker_scorers import with_extras as pooled

    with RewardManager({}, default=pooled, num_workers=1) as manager:
        out = call(manager, ["1", "x"], ["a", "b"], truths=["1", "1"])
    assert out.scores == [1.0, 0.0] and out.extras["pid"] == ["same", "same"]


def nan_extra(solution_str, ground_truth, extra_info=None):
    return {"score": 1.0, "ratio": float("nan") if solution_str == "x" else 0.5, "label": "text", "flag": True}


def test_non_finite_extra_values_are_kept_counted_and_logged(caplog):
    manager = RewardManager({"s": nan_extra})
    with caplog.at_level(logging.WARNING, logger="rlhf.rewards.manager"):
        out = call(manager, ["x", "y", "x"], ["s"] * 3)
    assert math.isnan(out.extras["ratio"][0]) and out.extras["ratio"][1] == 0.5
    assert out.metrics["reward/extra_nonfinite"] == 2 and out.metrics["reward/extra_nonfinite/ratio"] == 2
    assert "'ratio' in 2 row(s)" in caplog.text
    clean = call(manager, ["y"], ["s"])
    assert "reward/extra_nonfinite" not in clean.metrics  # strings and bools are not numbers to check
