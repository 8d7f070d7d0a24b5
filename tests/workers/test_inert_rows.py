"""Rows whose advantages are all 0 are left out of the policy update's forward and backward where the objective
says they add nothing (`PolicyObjective.skips_inert_rows`): the same step, fewer rows through the model."""

import pytest
import torch

from rlhf.algos import ClipCovLoss, KLLoss, PPOClipLoss, kl_k3
from rlhf.workers.objectives import PolicyObjective
from rlhf.workers.policy import PolicyWorker
from rlhf.workers.training import TrainingSetup, without_inert_rows
from helpers import scored_rollout, tiny_model_path, updated_group

# SGD with momentum: the update is a function of the gradients, so equal parameters mean equal gradients, and a
# step on a mini-batch with no live row still moves the weights (momentum) - on both paths alike
SGD = lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9)  # noqa: E731


def _worker(skip: bool, **training) -> PolicyWorker:
    objective = PolicyObjective(policy_loss=PPOClipLoss(clip_high=0.28), skip_inert_rows=skip)
    path = tiny_model_path()  # a reference only for `scored_rollout`'s columns; this objective reads none
    return PolicyWorker(path, objective=objective, optimizer=SGD, ref_model_path=path,
                        training=TrainingSetup(micro_batch_size=4, **training))


def _with_dead_groups(batch, n: int, dead: list[int]):
    """`batch` with the advantages of the groups (of `n` rows) numbered in `dead` set to 0."""
    adv = batch["advantages"].clone()
    for g in dead:
        adv[g * n:(g + 1) * n] = 0.0
    batch["advantages"] = adv
    return batch


@pytest.mark.parametrize("training", [dict(mini_batches=2), dict(mini_batches=2, max_tokens_per_micro_batch=120)])
def test_leaving_out_rows_without_advantage_gives_the_same_steps(training):
    """Two mini-batches of 3 groups of 4: the second has no live row at all (one row still runs, on zeros), the
    first one live group of three. Two updates, so the momentum of the first carries into the second."""
    skip, every = _worker(True, **training), _worker(False, **training)
    batch = _with_dead_groups(scored_rollout(every, prompts=6, n=4), 4, dead=[0, 2, 3, 4, 5])
    a, b = skip.update(batch), every.update(batch)
    assert a["actor/inert_rows_left_out"] == pytest.approx(19 / 24)  # 8 of 12, then 11 of 12 (one kept)
    assert "actor/inert_rows_left_out" not in b
    assert a["actor/micro_batches"] < b["actor/micro_batches"] or "max_tokens_per_micro_batch" in training
    second = _with_dead_groups(scored_rollout(every, prompts=6, n=4, seed=1), 4, dead=[1, 2, 3, 4])
    skip.update(second), every.update(second)
    pa, pb = skip.parameters_digest(), every.parameters_digest()
    for k in pa:
        torch.testing.assert_close(pa[k], pb[k], rtol=1e-5, atol=1e-6)


def test_a_batch_without_any_live_row_still_steps_the_optimizer():
    skip = _worker(True)
    before = skip.parameters_digest()
    skip.update(scored_rollout(skip, prompts=2, n=4))  # momentum from a live step
    after_live = skip.parameters_digest()
    out = skip.update(_with_dead_groups(scored_rollout(skip, prompts=2, n=4, seed=1), 4, dead=[0, 1]))
    assert out["actor/inert_rows_left_out"] == pytest.approx(7 / 8)
    moved = skip.parameters_digest()
    name = next(k for k in before if not torch.equal(before[k], after_live[k]))
    assert not torch.equal(moved[name], after_live[name])  # the momentum step happened


def test_which_objectives_leave_rows_out():
    assert PolicyObjective().skips_inert_rows
    assert not PolicyObjective(skip_inert_rows=False).skips_inert_rows
    assert not PolicyObjective(kl_loss=KLLoss(estimator=kl_k3, coef=0.1)).skips_inert_rows  # the KL reads every row
    assert not PolicyObjective(entropy_coef=0.01).skips_inert_rows  # the entropy bonus too
    assert not PolicyObjective(policy_loss=ClipCovLoss()).skips_inert_rows  # a batch statistic couples the rows
    path = tiny_model_path()
    kl = PolicyObjective(kl_loss=KLLoss(estimator=kl_k3, coef=0.1))
    assert not PolicyWorker(path, objective=kl, ref_model_path=path).plan.skip_inert_rows
    assert PolicyWorker(path, objective=PolicyObjective()).plan.skip_inert_rows
    assert not PolicyWorker(path).plan.skip_inert_rows  # inference only


def test_inert_rows_are_those_without_a_nonzero_advantage_on_a_response_token():
    objective = PolicyObjective()
    from rlhf.batch import Batch

    batch = Batch({"advantages": torch.tensor([[0.0, 0.0], [0.0, 1.0], [2.0, 0.0], [0.0, 0.0]]),
                   "response_mask": torch.tensor([[1, 1], [1, 1], [0, 1], [1, 0]])})
    assert objective.inert_rows(batch).tolist() == [True, False, True, True]  # a masked advantage does not count
    kept = without_inert_rows(batch, objective.inert_rows(batch))
    assert kept["advantages"].tolist() == [[0.0, 1.0]]
    none_live = Batch({"advantages": torch.zeros(3, 2), "response_mask": torch.tensor([[1, 1], [1, 0], [1, 1]])})
    one = without_inert_rows(none_live, torch.ones(3, dtype=torch.bool))
    assert one["response_mask"].tolist() == [[1, 0]]  # the shortest row stays


@pytest.mark.slow
@pytest.mark.usefixtures("ray_cluster")
def test_two_fsdp_ranks_that_keep_different_rows_equal_one_rank():
    """Three of four groups are inert: one rank keeps 1 row of 8, the other 4, so the first runs a blank
    micro-batch to match the other's two forwards (FSDP's collectives would otherwise hang); the step equals
    one rank's."""
    import fiddle as fdl

    objective = fdl.Config(PolicyObjective, policy_loss=fdl.Config(PPOClipLoss))
    batch = _with_dead_groups(scored_rollout(_worker(False), prompts=4, n=4), 4, dead=[0, 1, 3])
    _, (expected,) = updated_group(1, batch, strategy="fsdp", objective=objective)
    metrics, (rank0, rank1) = updated_group(2, batch, strategy="fsdp", objective=objective)
    assert sorted(m["actor/inert_rows_left_out"] for m in metrics) == [0.5, 0.875]
    assert metrics[0]["actor/micro_batches"] == metrics[1]["actor/micro_batches"] == 2  # 4 live rows, 3 a micro-batch
    for k in expected:
        torch.testing.assert_close(rank0[k], rank1[k], rtol=0, atol=0)
        torch.testing.assert_close(rank0[k], expected[k], rtol=1e-5, atol=1e-5)
