"""CombinedReward: weighted sum, per-source extras and metrics, lengths passed on, checks."""

import pytest

from rlhf.rewards import CombinedReward, RewardManager, UnknownDataSourceError, exact_match_score


def length(solution_str, ground_truth, extra_info=None):
    return {"score": float(len(solution_str)), "chars": len(solution_str)}


def boom(solution_str, ground_truth, extra_info=None):
    raise RuntimeError("no")


def test_weighted_sum_with_each_source_reported():
    combined = CombinedReward({
        "correct": (1.0, RewardManager({"a": exact_match_score})),
        "length": (-0.1, RewardManager({"a": length})),
    })
    out = combined(["1", "22", "1"], ["a"] * 3, ["1"] * 3, [None] * 3)
    # 1*1 - 0.1*1 = 0.9; 1*0 - 0.1*2 = -0.2; 0.9 again
    assert out.scores == pytest.approx([0.9, -0.2, 0.9])
    assert out.extras == {"correct/score": [1.0, 0.0, 1.0], "length/score": [1.0, 2.0, 1.0], "length/chars": [1, 2, 1]}
    assert out.metrics["reward/correct/mean"] == pytest.approx(2 / 3)
    assert out.metrics["reward/length/mean"] == pytest.approx(4 / 3)
    assert out.metrics["reward/correct/errors"] == 0.0 and out.metrics["reward/errors"] == 0.0


def test_source_failures_and_lengths_pass_through():
    combined = CombinedReward({
        "rule": (1.0, RewardManager({"a": boom}, strict=False, fallback_score=-1.0)),
        "shaped": (1.0, RewardManager({"a": exact_match_score}, overlong_buffer_len=2)),
    })
    out = combined(["1", "1"], ["a", "a"], ["1", "1"], [None, None], response_lengths=[2, 3], max_new_tokens=4)
    # rule: -1 each (fallback); shaped: 1 + 0 and 1 - 0.5
    assert out.scores == [0.0, -0.5]
    assert out.metrics["reward/errors"] == 1 * 2 and out.metrics["reward/rule/errors/a"] == 2.0
    assert out.metrics["reward/shaped/overlong_penalty/mean"] == pytest.approx(-0.25)
    assert out.extras["shaped/overlong_penalty"] == [0.0, -0.5]


def test_nested_and_custom_rewards():
    class Constant:
        def check_sources(self, data_sources):
            pass

        def __call__(self, responses, data_sources, ground_truths, extra_infos):
            from rlhf.rewards import RewardOutput

            return RewardOutput(scores=[2.0] * len(responses), metrics={"my/metric": 1.0})

    inner = CombinedReward({"c": (1.0, Constant())})
    outer = CombinedReward({"inner": (0.5, inner), "m": (1.0, RewardManager({"a": exact_match_score}))})
    out = outer(["1"], ["a"], ["1"], [None])
    assert out.scores == [2.0]  # 0.5 * 2 + 1
    assert out.metrics["reward/inner/c/mean"] == 2.0 and out.metrics["reward/inner/mean"] == 2.0
    assert out.metrics["inner/c/my/metric"] == 1.0


def test_check_sources_and_bad_arguments():
    combined = CombinedReward({"a": (1.0, RewardManager({"x": exact_match_score})),
                               "b": (1.0, RewardManager({"y": exact_match_score}))})
    with pytest.raises(UnknownDataSourceError, match="'x'"):
        combined.check_sources(["x"])
    with pytest.raises(ValueError, match="at least one source"):
        CombinedReward({})
    with pytest.raises(ValueError, match="without '/'"):
        CombinedReward({"a/b": (1.0, RewardManager({}))})
    with pytest.raises(TypeError, match="must be \\(weight, reward\\)"):
        CombinedReward({"a": RewardManager({})})
    with pytest.raises(TypeError, match="finite number"):
        CombinedReward({"a": (float("nan"), RewardManager({}))})
    with pytest.raises(TypeError, match="must be a reward such as RewardManager"):
        CombinedReward({"a": (1.0, exact_match_score)})


def test_close_closes_sources():
    closed = []

    class Closable(RewardManager):
        def close(self):
            closed.append(True)

    with CombinedReward({"a": (1.0, Closable({}))}):
        pass
    assert closed == [True]
