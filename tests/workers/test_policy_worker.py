"""PolicyWorker on the tiny model: generation, log-probs, update, requirements, save."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlhf.algos import KLLoss
from rlhf.data.generators import arithmetic_rows
from rlhf.models.loading import load_tokenizer
from rlhf.workers.objectives import PolicyObjective, SFTObjective
from rlhf.workers.policy import PolicyWorker
from rlhf.workers.training import TrainingSetup
from helpers import grpo_worker, scored_rollout, tiny_model_path


def reference_log_probs(model_path, batch, temperature=1.0):
    """log pi(y_t) by a plain full forward and log_softmax (independent of the worker's blocked pass)."""
    model = AutoModelForCausalLM.from_pretrained(model_path).eval()
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       position_ids=batch["position_ids"]).logits.double() / temperature
    R = batch["responses"].shape[1]
    log_p = torch.log_softmax(logits[:, -R - 1:-1], dim=-1)
    return log_p, log_p.gather(-1, batch["responses"][..., None]).squeeze(-1)


def test_trainer_log_probs_match_the_engines_before_any_update():
    worker = grpo_worker()
    batch = scored_rollout(worker)
    old = worker.compute_log_probs(batch)["old_log_probs"]
    mask = batch["response_mask"].bool()
    assert torch.allclose(old[mask], batch["rollout_log_probs"][mask], atol=1e-4)
    _, expected = reference_log_probs(tiny_model_path(), batch)
    assert torch.allclose(old[mask].double(), expected[mask], atol=1e-5)


def test_reference_log_probs_come_from_the_reference_model():
    path, ref_path = tiny_model_path(), tiny_model_path(seed=1)  # a different model as the reference
    worker = PolicyWorker(path, objective=PolicyObjective(kl_loss=KLLoss()), ref_model_path=ref_path,
                          training=TrainingSetup(micro_batch_size=4))
    batch = scored_rollout(worker)
    mask = batch["response_mask"].bool()
    ref = worker.compute_ref_log_probs(batch)["ref_log_probs"]
    _, expected = reference_log_probs(ref_path, batch)
    assert torch.allclose(ref[mask].double(), expected[mask], atol=1e-5)
    old = worker.compute_log_probs(batch)["old_log_probs"]
    assert (old[mask] - ref[mask]).abs().mean() > 0.1  # not the policy's own log-probs


def test_token_stats_for_the_optimal_token_baseline():
    worker = grpo_worker()
    batch = scored_rollout(worker)
    batch.meta["temperature"] = 0.7
    stats = worker.compute_token_stats(batch)
    mask = batch["response_mask"].bool()
    log_p, expected = reference_log_probs(tiny_model_path(), batch, temperature=0.7)
    assert torch.allclose(stats["old_log_probs"][mask].double(), expected[mask], atol=1e-5)
    sum_pi2 = log_p.exp().square().sum(-1)
    assert torch.allclose(stats["sum_pi_squared"][mask].double(), sum_pi2[mask], rtol=1e-4)
    # the same log-probs as compute_log_probs, whose LM head runs inside the log-prob function (rounding apart)
    torch.testing.assert_close(stats["old_log_probs"], worker.compute_log_probs(batch)["old_log_probs"],
                               rtol=0, atol=1e-5)


def test_update_moves_log_probs_the_way_the_advantages_point():
    worker = grpo_worker(optimizer=lambda params: torch.optim.SGD(params, lr=0.05))
    batch = scored_rollout(worker)
    mask = batch["response_mask"].bool()
    before = worker.compute_log_probs(batch)["old_log_probs"]
    metrics = worker.update(batch)
    change = worker.compute_log_probs(batch)["old_log_probs"] - before
    advantages = batch["advantages"]
    # a policy-gradient step raises log pi where A > 0 and lowers it where A < 0
    assert (advantages * change)[mask].sum() > 0
    assert change[mask & (advantages > 0.5)].mean() > 0 > change[mask & (advantages < -0.5)].mean()
    for name in ["actor/pg_loss", "actor/pg_clipfrac", "actor/kl_loss", "actor/entropy", "actor/grad_norm"]:
        assert name in metrics, name
    # update computes ref log-probs itself; with a KL loss every row is trained on
    assert worker.requirements() == {"old_log_probs": False, "ref_log_probs": False, "zero_advantage_rows_left_out": False}


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
