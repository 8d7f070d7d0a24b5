"""Each worker's decisions are made once, in its plan: the built worker holds what the plan says, and the
memory prediction counts what the plan says (rlhf.workers.policy_plan and the plans beside each worker)."""

from __future__ import annotations

import functools
from pathlib import Path

import torch

from helpers import grpo_worker, tiny_model_path
from rlhf.rollout.hf_engine import HFEngine
from rlhf.workers.memory import GiB, ModelShape, Placement, Workload
from rlhf.workers.policy import PolicyWorker
from rlhf.workers.training import TrainingSetup

torch.set_num_threads(1)
CONFIGS = Path(__file__).parents[2] / "rlhf_configs" / "model_configs"
QWEN05B = ModelShape.from_config(CONFIGS / "qwen2.5-0.5b.json")
BF16_ENGINE = functools.partial(HFEngine, dtype="bfloat16")  # what fdl.Partial(HFEngine, dtype=...) builds to


def policy_arguments(shape, engine):
    return dict(model_path=shape, ref_model_path=shape, objective=True, engine=engine,
                training=TrainingSetup(strategy="ddp", compute_dtype="bfloat16"))


def test_an_engine_with_its_own_bf16_copy_is_counted_in_every_phase():
    # one GPU, DDP, 64 rows of 512 + 512 tokens: the shared engine's plan was 8.812 / 10.39 / 75.995 GiB,
    # and the bf16 engine's was the same although it holds a second copy of the weights; each phase now also
    # holds the CUDA libraries' 64 MiB workspace (0.0625 GiB)
    work, gpu = Workload(512, 512, n=8, rows=64), Placement("cuda", 1, device_bytes=80e9)
    shared = PolicyWorker.predict_memory(policy_arguments(QWEN05B, HFEngine), work, gpu)
    own = PolicyWorker.predict_memory(policy_arguments(QWEN05B, BF16_ENGINE), work, gpu)
    assert [round(p.bytes / GiB, 3) for p in shared.phases] == [8.874, 10.452, 76.058]
    copy = 2 * QWEN05B.parameters("lm")  # bf16: 2 bytes per parameter, held for good (HFEngine.sleep frees nothing)
    for phase in own.phases:
        assert [t.bytes for t in phase.terms if t.name == "rollout engine weights (bfloat16)"] == [copy], phase.name
    for name in ("log-probs (no grad)", "update"):  # the same work, beside one more copy
        assert own.phase(name).bytes == shared.phase(name).bytes + copy
    # it decodes with its own bf16 weights: no bf16 cast of the fp32 actor's
    assert any("cast" in t.name for t in shared.phase("generation").terms)
    assert not any("cast" in t.name for t in own.phase("generation").terms)


def held_bytes(module: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def test_the_built_policy_worker_holds_what_its_plan_says():
    path = tiny_model_path()
    for engine, copy in ((HFEngine, False), (BF16_ENGINE, True)):
        worker = grpo_worker(engine=engine)
        plan = worker.plan
        assert plan == PolicyWorker.resolve_plan(dict(model_path=path, ref_model_path=path, objective=worker.objective,
                                                      engine=engine, training=TrainingSetup(micro_batch_size=4)),
                                                 on_gpu=False)
        assert plan.engine_copy is copy and worker.engine.shares_weights is not copy
        assert (worker.engine.model is worker.trainer.unwrapped()) is not copy
        assert plan.reference_model and worker.ref_model is not None and not plan.reference_is_base
        assert worker.shared_prefix == plan.shared_prefix and worker.keep_logits == plan.keep_logits
        assert worker.fused_lm_head == plan.fused_lm_head  # the tiny model's head is a plain Linear
        shape = ModelShape.from_config(path)
        estimate = PolicyWorker.predict_memory(dict(model_path=shape, ref_model_path=shape, objective=worker.objective,
                                                    engine=engine, training=TrainingSetup(micro_batch_size=4)),
                                               Workload(8, 6, n=4, rows=16), Placement())
        counted = [t.bytes for t in estimate.phase("update").terms if t.name.startswith("rollout engine weights")]
        assert counted == ([held_bytes(worker.engine.model)] if copy else [])
        assert worker.engine.model.dtype == (torch.bfloat16 if copy else torch.float32)


def test_the_built_critic_holds_what_its_plan_says():
    from rlhf.workers.critic import CriticWorker

    path = tiny_model_path()
    worker = CriticWorker(path, training=TrainingSetup(micro_batch_size=4))
    plan = CriticWorker.resolve_plan(dict(model_path=path, training=TrainingSetup(micro_batch_size=4)))
    assert (plan.model_path, plan.dtype, plan.training) == (path, "float32", worker.plan.training)
    assert worker.value_loss is worker.plan.value_loss  # the default loss, made once
    assert {p.dtype for p in worker.trainer.model.parameters()} == {torch.float32}
    estimate = CriticWorker.predict_memory(dict(model_path=ModelShape.from_config(path)), Workload(8, 6, rows=4),
                                           Placement())
    assert [t.bytes for t in estimate.phase("update").terms if t.name == "critic weights (fp32)"] == \
        [held_bytes(worker.trainer.model)]


def test_the_built_reward_model_worker_holds_what_its_plan_says():
    from helpers import tiny_reward_model
    from rlhf.workers.reward_model import RewardModelWorker

    path = tiny_reward_model()
    training = TrainingSetup(compute_dtype="bfloat16")
    worker = RewardModelWorker(path, training=training, max_length=64)
    assert worker.plan == RewardModelWorker.resolve_plan(dict(model_path=path, training=training, max_length=64))
    assert worker.plan.tokenizer_path == path and worker.max_length == worker.plan.max_length == 64
    assert {p.dtype for p in worker.trainer.model.parameters()} == {torch.bfloat16}  # stored in the compute dtype
    estimate = RewardModelWorker.predict_memory(dict(model_path=ModelShape.from_config(path), training=training),
                                                Workload(8, 6, rows=4), Placement())
    assert [t.bytes for t in estimate.phases[0].terms if t.name == "reward model weights (bfloat16)"] == \
        [held_bytes(worker.trainer.model)]


def test_the_built_rollout_worker_holds_what_its_plan_says():
    from rlhf.workers.rollout import RolloutWorker

    path = tiny_model_path()
    worker = RolloutWorker(path, engine=BF16_ENGINE, dtype="float32")
    assert worker.plan == RolloutWorker.resolve_plan(dict(model_path=path, engine=BF16_ENGINE))
    assert worker.engine.model.dtype == torch.float32  # the worker's dtype wins over the node's
    line = RolloutWorker.describe_placement(dict(model_path=path, engine=BF16_ENGINE), 1, False)
    assert line.startswith("rollout engine HFEngine (float32)") and f"{held_bytes(worker.engine.model) / 2**20:.3f} MB" in line


def test_the_plan_line_names_an_engine_copy_whole_on_every_rank():
    path = tiny_model_path()
    size = f"{held_bytes(HFEngine(path, dtype='bfloat16').model) / 2**20:.3f} MB"

    def line(engine):
        return PolicyWorker.describe_placement(dict(model_path=path, engine=engine,
                                                    training=TrainingSetup(strategy="fsdp")), 2, False)

    assert "rollout engine" not in line(HFEngine)  # shares the actor's (sharded) module
    assert f"rollout engine {size} per rank of {size}" in line(BF16_ENGINE)  # unsharded, in its own dtype
