"""PolicyWorker on the tiny model: generation, log-probs, update, requirements, save."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlhf.algos import KLLoss
from rlhf.data.generators import arithmetic_rows
from rlhf.models.loading import load_tokenizer
from rlhf.workers.objectives import PolicyObjective, SFTObjective
from rlhf.workers.policy import PolicyWorker
from helpers import grpo_worker, scored_rollout, tiny_model_path


def test_trainer_log_probs_match_the_engines_before_any_update():
    worker = grpo_worker()
    batch = scored_rollout(worker)
    old = worker.compute_log_probs(batch)["old_log_probs"]
    mask = batch["response_mask"].bool()
    assert torch.allclose(old[mask], batch["rollout_log_probs"][mask], atol=1e-4)
    # the reference is the same initial model
    assert torch.allclose(batch["ref_log_probs"][mask], old[mask], atol=1e-5)


def test_update_changes_weights_and_reports_verl_metrics():
    worker = grpo_worker()
    before = worker.parameters_digest()
    metrics = worker.update(scored_rollout(worker))
    after = worker.parameters_digest()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    for name in ["actor/pg_loss", "actor/pg_clipfrac", "actor/kl_loss", "actor/entropy", "actor/grad_norm"]:
        assert name in metrics, name
    assert worker.requirements() == {"old_log_probs": False, "ref": False}  # update computes ref log-probs itself


def test_update_computes_missing_reference_log_probs_itself():
    """A batch without ref_log_probs trains exactly as one the driver completed first."""
    sgd = lambda params: torch.optim.SGD(params, lr=0.1)  # noqa: E731
    inside, outside = grpo_worker(optimizer=sgd), grpo_worker(optimizer=sgd)
    batch = scored_rollout(outside)  # has ref_log_probs
    bare = batch.select([k for k in batch.keys() if k != "ref_log_probs"])
    a, b = inside.update(bare), outside.update(batch)
    assert a["actor/kl_loss"] == pytest.approx(b["actor/kl_loss"], rel=1e-6)
    assert "timing_s/ref_in_update" in a and "timing_s/ref_in_update" not in b
    pa, pb = inside.parameters_digest(), outside.parameters_digest()
    assert all(torch.equal(pa[k], pb[k]) for k in pa)


def test_multiple_mini_batches_need_old_log_probs():
    assert grpo_worker(mini_batches=2).requirements()["old_log_probs"] is True


def test_kl_loss_without_reference_is_refused():
    with pytest.raises(ValueError, match="ref_model_path"):
        PolicyWorker(tiny_model_path(), objective=PolicyObjective(kl_loss=KLLoss()))


def test_sft_update_lowers_the_loss_and_save_round_trips(tmp_path):
    from rlhf.data.sft import SFTDataset

    path = tiny_model_path()
    worker = PolicyWorker(path, objective=SFTObjective(), optimizer=lambda p: torch.optim.AdamW(p, lr=1e-2))
    data = SFTDataset(arithmetic_rows(16), load_tokenizer(path))
    batch = data.collate(range(16))
    losses = [worker.update(batch)["sft/loss"] for _ in range(5)]
    assert losses[-1] < losses[0]
    out = worker.save(str(tmp_path / "ckpt"))
    reloaded = AutoModelForCausalLM.from_pretrained(out)
    mine = worker.parameters_digest()
    for k, v in reloaded.state_dict().items():
        assert torch.equal(v, mine[k]), k
    tok = load_tokenizer(out)
    assert tok.decode(tok("What is 1+2?")["input_ids"]) == "What is 1+2?"


def test_shared_prefix_log_probs_and_update_equal_full_forwards():
    """The shared-prompt forward (the default) changes cost, not results: same log-probs, same step."""
    sgd = lambda params: torch.optim.SGD(params, lr=0.1)  # noqa: E731  (Adam's first step amplifies rounding)
    shared, full = grpo_worker(shared_prefix=True, optimizer=sgd), grpo_worker(shared_prefix=False, optimizer=sgd)
    assert grpo_worker(strategy="ddp").shared_prefix is True  # the default except under FSDP (GPUs' default)
    batch = scored_rollout(full, prompts=3, n=4)  # 4 rows share each prompt; micro-batches of 4 cut groups unevenly
    for method, key in [("compute_log_probs", "old_log_probs"), ("compute_ref_log_probs", "ref_log_probs")]:
        a, b = getattr(shared, method)(batch)[key], getattr(full, method)(batch)[key]
        assert torch.allclose(a, b, atol=1e-5), method
    ma, mb = shared.update(batch), full.update(batch)
    for name in ["actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "actor/entropy"]:
        assert ma[name] == pytest.approx(mb[name], rel=1e-4, abs=1e-6), name
    pa, pb = shared.parameters_digest(), full.parameters_digest()
    for k in pa:
        assert torch.allclose(pa[k], pb[k], atol=1e-6), k


def test_the_trainer_engine_log_prob_gap_is_logged_every_update_and_is_rounding_with_a_shared_module():
    """`rollout_corr/log_prob_abs_diff` (mean) and `..._max` come from the update's own log-probs
    when on-policy, from old_log_probs otherwise; the HF engine shares the actor, so both are ~0,
    while a batch whose rollout log-probs are off by 0.5 (a stale engine) shows exactly that."""
    worker = grpo_worker()
    batch = scored_rollout(worker)
    metrics = worker.update(batch)
    assert metrics["rollout_corr/log_prob_abs_diff"] < 1e-5 and metrics["rollout_corr/log_prob_abs_diff_max"] < 1e-4
    stale = grpo_worker()
    batch = scored_rollout(stale)
    batch["rollout_log_probs"] = batch["rollout_log_probs"] - 0.5 * batch["response_mask"]
    metrics = stale.update(batch)
    assert metrics["rollout_corr/log_prob_abs_diff"] == pytest.approx(0.5, abs=1e-4)
    assert metrics["rollout_corr/log_prob_abs_diff_max"] == pytest.approx(0.5, abs=1e-4)
    off_policy = grpo_worker(mini_batches=2)
    batch = scored_rollout(off_policy)
    batch = batch.union(off_policy.compute_log_probs(batch))
    batch["old_log_probs"] = batch["old_log_probs"] + 0.25 * batch["response_mask"]
    metrics = off_policy.update(batch)
    assert metrics["rollout_corr/log_prob_abs_diff"] == pytest.approx(0.25, abs=1e-4)
    assert metrics["rollout_corr/log_prob_abs_diff_max"] == pytest.approx(0.25, abs=1e-4)
