"""The public surface of rlhf.algos: names, signatures the framework relies on, purity."""

import inspect

import pytest
import pathlib
import re

import rlhf.algos as algos

SRC = pathlib.Path(algos.__file__).parent


def test_all_names_resolve_and_are_documented():
    for name in algos.__all__:
        obj = getattr(algos, name)
        assert inspect.getdoc(obj), f"{name} has no docstring"


def test_pure_math_imports_only():
    forbidden = re.compile(r"^\s*(import|from)\s+(fiddle|torch\.distributed|ray|accelerate|transformers|vllm|aim)\b", re.M)
    for path in SRC.glob("*.py"):
        assert not forbidden.search(path.read_text()), f"{path.name} imports outside pure math"


def test_estimators_declare_critic_needs():
    estimators = [
        algos.GAE, algos.GRPO, algos.GRPOPassK, algos.RLOO, algos.OPO, algos.GPG,
        algos.ReinforcePlusPlus, algos.ReinforcePlusPlusBaseline, algos.ReMax, algos.OptimalTokenBaseline,
    ]
    assert [e for e in estimators if e.requires_critic] == [algos.GAE]


def test_signatures_the_framework_calls():
    def params(fn):
        return list(inspect.signature(fn).parameters)

    for agg in (algos.token_mean, algos.seq_mean_token_sum, algos.seq_mean_token_mean, algos.seq_mean_token_sum_norm):
        assert params(agg)[:4] == ["loss_mat", "mask", "num_tokens", "num_seqs"]
    loss_classes = [
        algos.PPOClipLoss, algos.GSPOLoss, algos.SAPOLoss, algos.GPGLoss, algos.ClipCovLoss,
        algos.KLCovLoss, algos.GMPOLoss, algos.CISPOLoss, algos.REINFORCELoss,
    ]
    for cls in loss_classes:
        assert "aggregate" in params(cls)
        assert params(cls.__call__)[1:7] == ["log_probs", "old_log_probs", "advantages", "response_mask", "num_tokens", "num_seqs"]
    assert params(algos.PPOClipLoss)[:3] == ["clip_low", "clip_high", "dual_clip"]
    assert params(algos.KLLoss) == ["estimator", "coef", "aggregate"]
    assert params(algos.ClippedValueLoss) == ["clip_range", "aggregate"]
    assert params(algos.AdaptiveKLController) == ["init_coef", "target_kl", "horizon"]
    assert params(algos.apply_kl_penalty) == [
        "token_level_scores", "log_probs", "ref_log_probs", "response_mask", "coef", "estimator",
    ]


def test_losses_and_estimators_are_frozen_so_a_shared_default_cannot_drift():
    """`RLTrainer(advantage=GRPO())` and `PolicyObjective(policy_loss=PPOClipLoss())` share one default
    instance between all callers: changing it in place is refused, naming the fix."""
    from rlhf.trainers.rl import RLTrainer
    from rlhf.workers.objectives import PolicyObjective
    import inspect

    for default in (inspect.signature(RLTrainer).parameters["advantage"].default,
                    inspect.signature(PolicyObjective).parameters["policy_loss"].default):
        name = next(iter(vars(default)))
        with pytest.raises(AttributeError, match=rf"{type(default).__name__}\.{name} is read-only.*build a new"):
            setattr(default, name, 0.5)
