"""Precision by construction: fp32 master weights whatever the compute dtype; bf16 storage of a
trained model is refused, at construction and at preflight, naming the field and the fix."""

import fiddle as fdl
import pytest
import torch

from rlhf.runtime.preflight_hooks import hook_problems
from rlhf.workers.critic import CriticWorker
from rlhf.workers.objectives import PolicyObjective
from rlhf.workers.policy import PolicyWorker
from rlhf.workers.training import ModelTrainer
from rlhf.workers.training import TrainingSetup
from helpers import grpo_worker, scored_rollout, tiny_model_path

LR = 1e-6  # the GSM8K recipes' learning rate


def _changed_fraction(before: dict, after: dict) -> float:
    changed = sum(int((before[k] != after[k]).sum()) for k in before)
    return changed / sum(v.numel() for v in before.values())


def test_one_small_adamw_step_moves_the_weights_of_a_bf16_compute_policy():
    worker = grpo_worker(compute_dtype="bfloat16", optimizer=lambda p: torch.optim.AdamW(p, lr=LR))
    assert all(p.dtype == torch.float32 for p in worker.trainer.unwrapped().parameters())  # master weights
    assert all(p.dtype == torch.bfloat16 for p in worker.ref_model.parameters())  # frozen: compute dtype
    batch = scored_rollout(worker)
    before = worker.parameters_digest()
    worker.update(batch)
    assert _changed_fraction(before, worker.parameters_digest()) >= 0.90


def test_the_same_step_on_weights_stored_in_bf16_rounds_away():
    """The failure the check prevents (why the recipes could not learn): bf16 storage, same step."""
    from rlhf.models.loading import load_causal_lm

    worker = grpo_worker(optimizer=lambda p: torch.optim.AdamW(p, lr=LR))
    batch = scored_rollout(worker)
    model = load_causal_lm(tiny_model_path(), "bfloat16")
    trainer = ModelTrainer(model, lambda p: torch.optim.AdamW(p, lr=LR), setup=TrainingSetup(micro_batch_size=4))
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}

    def micro_loss(micro, num_tokens, num_seqs):
        from rlhf.workers.policy import response_log_probs

        log_probs, _ = response_log_probs(trainer.model, micro, 1.0)
        return -(log_probs * micro["advantages"] * micro["response_mask"]).sum() / num_tokens, {}

    trainer.update(batch, micro_loss)
    assert _changed_fraction(before, model.state_dict()) < 0.10


def test_bf16_compute_runs_the_forward_in_bf16():
    worker = grpo_worker(compute_dtype="bfloat16")
    seen = []
    handle = worker.trainer.unwrapped().lm_head.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    try:
        worker.update(scored_rollout(worker))
    finally:
        handle.remove()
    assert seen and set(seen) == {torch.bfloat16}


@pytest.mark.parametrize("make", [
    lambda: PolicyWorker(tiny_model_path(), objective=PolicyObjective(), dtype="bfloat16"),
    lambda: CriticWorker(tiny_model_path(), dtype="bfloat16"),
])
def test_trained_model_stored_in_bf16_is_refused_with_the_fix(make):
    with pytest.raises(ValueError, match=r"dtype='bfloat16' stores the trained weights.*compute_dtype='bfloat16'"):
        make()


def test_inference_only_policy_may_be_stored_in_bf16():
    worker = PolicyWorker(tiny_model_path(), dtype="bfloat16")
    assert next(worker.trainer.model.parameters()).dtype == torch.bfloat16


def test_float16_training_and_unknown_dtypes_are_refused():
    with pytest.raises(ValueError, match="loss scaling"):
        PolicyWorker(tiny_model_path(), objective=PolicyObjective(), training=TrainingSetup(compute_dtype="float16"))
    with pytest.raises(ValueError, match="compute_dtype='bf16' is not a supported dtype"):
        PolicyWorker(tiny_model_path(), objective=PolicyObjective(), training=TrainingSetup(compute_dtype="bf16"))


def test_preflight_names_the_graph_path_before_any_model_loads():
    graph = fdl.Config(dict, policy=fdl.Config(PolicyWorker, model_path="/nonexistent/model",
                                                objective=fdl.Config(PolicyObjective), dtype="bfloat16"))
    problems = hook_problems(graph)
    assert len(problems) == 1
    assert problems[0].startswith("- at .policy: PolicyWorker.dtype='bfloat16'") and "compute_dtype" in problems[0]
