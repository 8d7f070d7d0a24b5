"""Token-budget micro-batches through the workers: same log-probs, values and update as row-count
micro-batches (loss normalisation is by global token counts), fewer padded tokens."""

import pytest
import torch

from rlhf.algos import PPOClipLoss, seq_mean_token_sum_norm
from rlhf.workers.critic import CriticWorker
from rlhf.workers.objectives import PolicyObjective
from rlhf.workers.policy import PolicyWorker
from rlhf.workers.training import TrainingSetup
from helpers import grpo_worker, scored_rollout, tiny_model_path

SGD = lambda params: torch.optim.SGD(params, lr=0.1)  # noqa: E731  (Adam's first step amplifies rounding)
BUDGET = 120  # tokens per micro-batch: a few rows of the ~40-token arithmetic rollouts


def test_log_probs_and_update_equal_the_row_count_path():
    rows, tokens = grpo_worker(optimizer=SGD), grpo_worker(optimizer=SGD, max_tokens_per_micro_batch=BUDGET)
    batch = scored_rollout(rows, prompts=6, n=4)
    mask = batch["response_mask"].bool()
    want, got = rows.compute_log_probs(batch)["old_log_probs"], tokens.compute_log_probs(batch)["old_log_probs"]
    assert got.shape == want.shape
    torch.testing.assert_close(got[mask], want[mask], rtol=1e-5, atol=1e-5)
    a, b = rows.update(batch), tokens.update(batch)
    assert b["actor/micro_batches"] != a["actor/micro_batches"]  # really cut differently
    assert b["actor/rows_over_token_budget"] == 0
    assert a["actor/entropy"] == pytest.approx(b["actor/entropy"], rel=1e-5)  # a token mean: partition-free
    pa, pb = rows.parameters_digest(), tokens.parameters_digest()
    for k in pa:
        torch.testing.assert_close(pa[k], pb[k], rtol=1e-5, atol=1e-6)


def test_critic_values_equal_the_row_count_path():
    batch = scored_rollout(grpo_worker(), prompts=6, n=4)
    torch.manual_seed(0)  # the value head is freshly initialised: the same head for both
    rows = CriticWorker(tiny_model_path(), training=TrainingSetup(micro_batch_size=4))
    torch.manual_seed(0)
    tokens = CriticWorker(tiny_model_path(), training=TrainingSetup(max_tokens_per_forward=BUDGET))
    torch.testing.assert_close(tokens.compute_values(batch)["values"], rows.compute_values(batch)["values"],
                               rtol=1e-5, atol=1e-6)


def test_the_dr_grpo_normaliser_is_partition_free():
    """seq_mean_token_sum_norm divides by the batch's generation limit (meta `max_new_tokens`), not by
    the width of a micro-batch, so token-budget micro-batches (trimmed per micro-batch) give the
    row-count update."""
    path = tiny_model_path()

    def worker(**kw):
        objective = PolicyObjective(policy_loss=PPOClipLoss(aggregate=seq_mean_token_sum_norm))
        return PolicyWorker(path, objective=objective, ref_model_path=path, optimizer=SGD,
                            training=TrainingSetup(micro_batch_size=4, **kw))

    rows, tokens = worker(), worker(max_tokens_per_micro_batch=BUDGET)
    batch = scored_rollout(rows, prompts=6, n=4)
    a, b = rows.update(batch), tokens.update(batch)
    assert b["actor/micro_batches"] != a["actor/micro_batches"]  # really cut differently
    pa, pb = rows.parameters_digest(), tokens.parameters_digest()
    for k in pa:
        torch.testing.assert_close(pa[k], pb[k], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("keep_logits", [True, False])  # the CPU default, and the GPU one
def test_fused_lm_head_gives_the_same_log_probs_and_update(keep_logits):
    """The LM head applied inside the log-prob function (the default) changes memory, not results."""
    plain, fused = grpo_worker(optimizer=SGD, fused_lm_head=False), grpo_worker(optimizer=SGD)
    assert fused.fused_lm_head and not plain.fused_lm_head and fused.keep_logits  # on a CPU
    fused.keep_logits = keep_logits
    batch = scored_rollout(plain)
    mask = batch["response_mask"].bool()
    for method, key in (("compute_log_probs", "old_log_probs"), ("compute_ref_log_probs", "ref_log_probs")):
        want, got = getattr(plain, method)(batch)[key], getattr(fused, method)(batch)[key]
        torch.testing.assert_close(got[mask], want[mask], rtol=1e-5, atol=1e-5)
    plain.update(batch), fused.update(batch)
    pa, pb = plain.parameters_digest(), fused.parameters_digest()
    for k in pa:
        torch.testing.assert_close(pa[k], pb[k], rtol=1e-5, atol=1e-6)
    assert type(fused.trainer.unwrapped().lm_head) is torch.nn.Linear  # the head is back after every forward
