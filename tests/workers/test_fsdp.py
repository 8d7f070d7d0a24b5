"""FSDP2 as the project applies it, on CPU over gloo: the same code that shards on GPUs.

2 FSDP ranks through Ray equal 1 rank in this process after an update; each rank holds half of
the actor's, the reference model's and a teacher's parameters (whose log-probs agree); the sharded
actor decodes (the ranks' rows end at different steps); FSDP at world size 1 equals DDP."""

import pytest
import torch

from helpers import group_plan, grpo_worker, scored_rollout, tiny_model_path
from rlhf.rollout.sampling import SamplingParams
from rlhf.runtime.local import LocalRuntime
from rlhf.runtime.ray_runtime import RayRuntime
from rlhf.workers.fsdp import decoder_layers, is_sharded


def _prompts(n: int):
    from rlhf.data.generators import arithmetic_rows
    from rlhf.data.prompts import PromptDataset
    from rlhf.models.loading import load_tokenizer

    return PromptDataset(arithmetic_rows(n, seed=1), load_tokenizer(tiny_model_path())).collate(range(n))


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def test_fsdp_at_world_size_one_equals_ddp_and_shards_every_model():
    batch = scored_rollout(grpo_worker(strategy="ddp"), prompts=2, n=4)
    digests = {}
    for strategy in ("ddp", "fsdp"):
        worker = grpo_worker(strategy=strategy, optimizer=lambda p: torch.optim.SGD(p, lr=0.1))
        worker.update(batch)
        digests[strategy] = worker.parameters_digest()
    assert is_sharded(worker.trainer.model) and is_sharded(worker.ref_model)  # the last worker: FSDP
    assert all(is_sharded(layer) for layer in decoder_layers(worker.trainer.model))
    assert _max_diff(digests["ddp"], digests["fsdp"]) < 1e-6


def test_the_teacher_is_sharded_like_the_reference_and_scores_alike():
    batch = scored_rollout(grpo_worker(strategy="ddp"), prompts=2, n=4)
    scores = {}
    for strategy in ("ddp", "fsdp"):
        worker = grpo_worker(strategy=strategy, teacher_model_path=tiny_model_path(seed=1))
        scores[strategy] = worker.compute_teacher_log_probs(batch)["teacher_log_probs"]
    assert is_sharded(worker.teacher_model) and all(is_sharded(layer) for layer in decoder_layers(worker.teacher_model))
    assert not worker.teacher_model.training and not any(p.requires_grad for p in worker.teacher_model.parameters())
    torch.testing.assert_close(scores["fsdp"], scores["ddp"], atol=1e-5, rtol=1e-5)


def test_fused_lm_head_under_fsdp_gives_the_same_update():
    batch = scored_rollout(grpo_worker(strategy="ddp"), prompts=2, n=4)
    digests = []
    for fused in (False, True):
        worker = grpo_worker(strategy="fsdp", fused_lm_head=fused, optimizer=lambda p: torch.optim.SGD(p, lr=0.1))
        worker.update(batch)
        digests.append(worker.parameters_digest())
    assert _max_diff(*digests) < 1e-5


@pytest.mark.slow
@pytest.mark.usefixtures("ray_cluster")
def test_two_fsdp_ranks_equal_one_rank_and_hold_half_of_each_model():
    batch = scored_rollout(grpo_worker(strategy="ddp"), prompts=4, n=4)  # 16 rows, ragged lengths
    local = LocalRuntime()
    teacher = tiny_model_path(seed=1)  # on-policy distillation's teacher: sharded like the reference
    one = local.start_groups(group_plan(1, strategy="fsdp", teacher_model_path=teacher))["policy"]
    expected_teacher = one.compute_teacher_log_probs(batch)["teacher_log_probs"]
    one.update(batch)
    (expected,) = one.parameters_digest()
    (whole,) = one.parameter_bytes()
    local.shutdown()

    ray_runtime = RayRuntime(num_cpus=2)
    try:
        two = ray_runtime.start_groups(group_plan(2, strategy="fsdp", max_tokens_per_micro_batch=60,
                                                  teacher_model_path=teacher))["policy"]
        metrics = two.update(batch)
        assert metrics[0]["actor/micro_batches"] == metrics[1]["actor/micro_batches"]
        rank0, rank1 = two.parameters_digest()
        halves = two.parameter_bytes()  # before the teacher's first forward, which leaves its root group gathered
        teacher_log_probs = two.compute_teacher_log_probs(batch)["teacher_log_probs"]
        rollout = two.generate(_prompts(6), SamplingParams(n=2, max_new_tokens=12, temperature=1.5))
    finally:
        ray_runtime.shutdown()
    assert _max_diff(rank0, rank1) == 0.0, "the ranks' gathered weights differ"
    assert _max_diff(rank0, expected) < 1e-5, "2 FSDP ranks != 1 rank"
    assert len(rollout) == 12 and rollout["response_mask"].sum(1).min() > 0  # sharded decoding completed
    mask = batch["response_mask"].bool()  # past a row's end the values depend on its micro-batch's trimming
    torch.testing.assert_close(teacher_log_probs[mask], expected_teacher[mask], atol=1e-5, rtol=1e-5)
    for name in ("actor", "reference", "teacher"):
        per_rank = [h[name] for h in halves]
        assert sum(per_rank) == whole[name], name  # every parameter is held exactly once
        assert max(per_rank) <= whole[name] / 2 * 1.02, f"{name}: a rank holds more than half: {per_rank}"
