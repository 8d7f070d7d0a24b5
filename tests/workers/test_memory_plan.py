"""The memory planner's arithmetic (rlhf.workers.memory) and each worker's `predict_memory`, without a model,
and the prediction against live tensor bytes measured on the tiny model (rlhf.workers.memory_probe)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from helpers import grpo_worker, scored_rollout, tiny_model_path
from rlhf.algos import logprobs
from rlhf.rollout.hf_engine import HFEngine
from rlhf.workers import memory
from rlhf.workers.critic import CriticWorker
from rlhf.workers.memory import ModelShape, Placement, Workload
from rlhf.workers.memory_probe import PeakMemory, live_bytes
from rlhf.workers.policy import PolicyWorker
from rlhf.workers.reward_model import RewardModelWorker
from rlhf.workers.training import TrainingSetup

ROOT = Path(__file__).parents[2]
CONFIGS = ROOT / "rlhf_configs" / "model_configs"
QWEN7B = ModelShape.from_config(CONFIGS / "qwen2.5-7b.json")


def policy_arguments(shape, **training):
    return dict(model_path=shape, ref_model_path=shape, objective=True, training=TrainingSetup(**training),
                engine=HFEngine, dtype="float32", adapter=None, shared_prefix=None, fused_lm_head=None,
                logits_block_elements=None)


@pytest.mark.parametrize("name, billions", [("qwen2.5-0.5b", 0.494), ("qwen2.5-7b", 7.616), ("llama-3.1-8b", 8.030)])
def test_shipped_configs_count_the_published_parameters(name, billions):
    assert ModelShape.from_config(CONFIGS / f"{name}.json").parameters() / 1e9 == pytest.approx(billions, abs=1e-3)


def test_parameter_counts_equal_a_meta_device_build():
    from transformers import AutoConfig, AutoModelForCausalLM

    path = tiny_model_path(hidden_size=64, num_layers=4)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path))
    assert ModelShape.from_config(path).parameters("lm") == sum(p.numel() for p in model.parameters())


def test_block_budgets_are_the_kernels():
    assert memory.CPU_BLOCK_ELEMENTS == logprobs.MAX_BLOCK_ELEMENTS
    assert memory.GPU_BLOCK_ELEMENTS == logprobs.MAX_BLOCK_ELEMENTS_GPU


def test_saved_activations_per_layer_by_hand():
    # H=8, I=16, 2 heads x 4 = q 8, width 10: 6*8 + 4*16 + 4*8 + 2 + 10 + 2 = 158 elements per token per layer
    shape = ModelShape(vocab=10, hidden=8, intermediate=16, layers=3, heads=2, kv_heads=1, head_dim=4)
    (acts, *_) = memory.training_activation_terms(shape, rows=2, width=10, compute="float32",
                                                  gradient_checkpointing=False, placement=Placement())
    assert acts.bytes == 3 * 158 * 20 * 4


def test_knobs_move_the_prediction_the_way_they_should():
    work = Workload(prompt_tokens=1024, response_tokens=1024, n=8, rows=64)
    gpu = Placement("cuda", 8, fsdp=True, device_bytes=80e9, process_group=True)
    base = PolicyWorker.predict_memory(policy_arguments(QWEN7B, compute_dtype="bfloat16",
                                                        max_tokens_per_micro_batch=16384), work, gpu)
    ckpt = PolicyWorker.predict_memory(policy_arguments(QWEN7B, compute_dtype="bfloat16", gradient_checkpointing=True,
                                                        max_tokens_per_micro_batch=16384), work, gpu)
    assert ckpt.phase("update").bytes < base.phase("update").bytes / 2
    offload = PolicyWorker.predict_memory(policy_arguments(QWEN7B, compute_dtype="bfloat16",
                                                           max_tokens_per_micro_batch=16384),
                                          work, dataclasses.replace(gpu, cpu_offload=True))
    # the fp32 weights, gradients and AdamW moments of a 1/8 shard (16 bytes per parameter) go to the host
    moved = base.phase("update").bytes - offload.phase("update").bytes
    assert moved == pytest.approx(16 * QWEN7B.parameters() / 8, rel=1e-6)
    assert sum(t.bytes for t in offload.host) == pytest.approx(moved)
    more = PolicyWorker.predict_memory(policy_arguments(QWEN7B, compute_dtype="bfloat16",
                                                        max_tokens_per_micro_batch=16384),
                                       dataclasses.replace(work, rows=32), dataclasses.replace(gpu, world_size=16))
    assert more.peak < base.peak
    unfused = PolicyWorker.predict_memory({**policy_arguments(QWEN7B, compute_dtype="bfloat16",
                                                              max_tokens_per_micro_batch=16384),
                                           "fused_lm_head": False}, work, gpu)
    logits = [t for t in unfused.phase("update").terms if t.name.startswith("logits")]
    assert logits and not [t for t in base.phase("update").terms if t.name.startswith("logits")]


def test_fewer_rows_per_generate_call_shrink_the_kv_cache():
    import functools

    work = Workload(prompt_tokens=512, response_tokens=2048, n=8, rows=256)
    all_rows = PolicyWorker.predict_memory(policy_arguments(QWEN7B), work, Placement("cuda", 8, fsdp=True))
    capped = PolicyWorker.predict_memory({**policy_arguments(QWEN7B),
                                          "engine": functools.partial(HFEngine, max_rows_per_call=64)},
                                         work, Placement("cuda", 8, fsdp=True))
    kv = lambda e: next(t.bytes for t in e.phase("generation").terms if t.name.startswith("KV cache"))  # noqa: E731
    assert kv(capped) == pytest.approx(kv(all_rows) / 4)  # 64 of 256 rows at once


SMOLLM2 = ModelShape(vocab=49152, hidden=576, intermediate=1536, layers=30, heads=9, kv_heads=3, head_dim=64,
                     tied_embeddings=True)


def terms_of(phase) -> dict[str, float]:
    return {t.name: t.bytes for t in phase.terms}


def test_fsdp_counts_the_root_group_gathered():
    # fully_shard on every layer, then the root: the root group is the embedding (= the tied head), the final
    # norm and the head; FSDP2 keeps it unsharded from a forward to the end of the next backward
    root = 49152 * 576 + 576
    assert memory.root_group_parameters(SMOLLM2, "lm") == root
    assert memory.root_group_parameters(SMOLLM2, "score") == root + 576
    work = Workload(prompt_tokens=48, response_tokens=16, n=4, rows=8)
    scorer = lambda placement: RewardModelWorker.predict_memory(  # noqa: E731
        dict(model_path=SMOLLM2, training=TrainingSetup(strategy="fsdp")), work, placement)
    one = terms_of(scorer(Placement(fsdp=True)).phase("score (no grad)"))
    assert one["reward model FSDP root group gathered: embedding/head (float32)"] == 4 * (root + 576)
    assert not any("all-gather buffer" in name for name in one)  # one rank copies the shard, no collective
    two = terms_of(scorer(Placement(world_size=2, fsdp=True)).phase("score (no grad)"))
    assert two["reward model FSDP root group gathered: embedding/head (float32)"] == 4 * (root + 576)
    # the first forward on two ranks also holds the root's all-gather output until the first layer's copy-out
    assert two["FSDP root all-gather buffer (until the first layer is gathered)"] == 4 * (root + 576)
    ddp = terms_of(scorer(Placement()).phase("score (no grad)"))
    assert not any("FSDP" in name for name in ddp)

    policy = PolicyWorker.predict_memory(policy_arguments(SMOLLM2, strategy="fsdp", max_tokens_per_micro_batch=512),
                                         work, Placement(world_size=2, fsdp=True))
    for phase in policy.phases:  # the reference's root for good; the actor's from generation to its backward
        names = terms_of(phase)
        assert names["reference FSDP root group gathered: embedding/head (float32)"] == 4 * root
        assert names["actor FSDP root group gathered: embedding/head (float32)"] == 4 * root
    # one micro-batch per optimizer step: no gradient exists yet at the activation peak, but the LM head's
    # (unsharded, before its reduce-scatter)
    update = terms_of(policy.phase("update"))
    assert update["LM head gradient, unsharded (before its reduce-scatter)"] == 4 * 49152 * 576
    assert "actor gradients (fp32)" not in update


def test_an_update_peaks_at_its_largest_moment():
    work = Workload(prompt_tokens=48, response_tokens=16, n=4, rows=16)
    update = lambda budget, **kw: terms_of(PolicyWorker.predict_memory(  # noqa: E731
        {**policy_arguments(SMOLLM2, strategy="ddp", max_tokens_per_micro_batch=budget), **kw}, work,
        Placement()).phase("update"))
    # 16 rows of 64 tokens: a 1,024-token budget takes them in one micro-batch, whose backward starts before
    # any gradient of the step exists but the LM head's; a 512-token budget's second micro-batch finds them all
    one, two = update(1024, shared_prefix=False), update(512, shared_prefix=False)
    assert "actor gradients (fp32)" not in one and one["LM head gradient (fp32)"] == 4 * 49152 * 576
    assert "actor gradients (fp32)" in two and "LM head gradient (fp32)" not in two
    # a shared-prefix micro-batch (one prompt, four samples): autograd holds the response pass's gradient of
    # every weight until the prompt pass adds its own, which outweighs its small activations
    shared = update(256, shared_prefix=True)
    assert shared["response pass weight gradients (fp32), held until the prompt pass's are added"] == \
        4 * SMOLLM2.parameters()


def test_the_lean_decoder_under_fsdp_reads_the_gathered_root_in_place():
    work = Workload(prompt_tokens=48, response_tokens=16, n=4, rows=8)
    two = PolicyWorker.predict_memory(policy_arguments(SMOLLM2, strategy="fsdp"), work,
                                      Placement(world_size=2, fsdp=True))
    names = terms_of(two.phase("generation"))
    # every layer gathered (kept until the fused copies are made), the embedding not copied
    assert names["decoder weights (float32, gathered)"] == 4 * 30 * SMOLLM2.layer_parameters
    assert names["decoder's fused q/k/v and gate/up weights"] == 4 * SMOLLM2.fused_projection_parameters


def test_critic_has_no_vocabulary_term():
    work = Workload(prompt_tokens=256, response_tokens=256, n=1, rows=16)
    critic = CriticWorker.predict_memory(dict(model_path=QWEN7B, training=TrainingSetup()), work, Placement())
    assert not any("logit" in t.name for p in critic.phases for t in p.terms)


def test_the_probe_counts_live_bytes():
    kept = torch.zeros(1000)  # noqa: F841 - alive before the block: 4,000 bytes
    with PeakMemory() as m:
        a = torch.ones(2000)  # 8,000
        b = a * 2  # 8,000 more
        del a
        c = b + 1  # 8,000 again (a was freed)
    assert m.start >= 4000 and m.peak - m.start == 16000
    del b, c


def test_policy_prediction_within_15_percent_of_the_measured_peak_on_the_tiny_model():
    # the probe counts every live tensor of the process; in a long pytest session earlier tests leave
    # some (module caches, fixtures), so what was alive before the worker existed is taken off
    baseline = live_bytes()
    worker = grpo_worker(strategy="ddp", micro_batch_size=4)
    batch = scored_rollout(worker, prompts=4, n=4)
    worker.update(batch)  # the steady state: gradients and AdamW moments exist
    with PeakMemory() as update:
        worker.update(batch)
    with PeakMemory() as forward:
        worker.compute_log_probs(batch)
    arguments = {**policy_arguments(tiny_model_path(), micro_batch_size=4, strategy="ddp"),
                 "objective": worker.objective}
    p, r = batch["prompts"].shape[1], batch["responses"].shape[1]
    predicted = PolicyWorker.predict_memory(arguments, Workload(p, r, n=4, rows=len(batch)), Placement())
    assert predicted.phase("update").bytes == pytest.approx(update.peak - baseline, rel=0.15)
    assert predicted.phase("log-probs (no grad)").bytes == pytest.approx(forward.peak - baseline, rel=0.15)


def test_every_cuda_phase_holds_the_math_libraries_workspace_and_no_cpu_phase_does():
    """Measured on an H100: each tiny-model phase peaked ~65 MiB above its tensors (cuBLAS + cuBLASLt workspaces)."""
    work = Workload(prompt_tokens=64, response_tokens=64, n=4, rows=16)
    for cls, arguments in ((PolicyWorker, policy_arguments(QWEN7B)), (CriticWorker, {"model_path": QWEN7B}),
                           (RewardModelWorker, {"model_path": QWEN7B})):
        gpu = cls.predict_memory(arguments, work, Placement("cuda", 1))
        cpu = cls.predict_memory(arguments, work, Placement("cpu", 1))
        for phase in gpu.phases:
            workspace = [t for t in phase.terms if t.name.startswith("CUDA library workspaces")]
            assert [t.bytes for t in workspace] == [64 * 2**20], (cls.__name__, phase.name)
        assert not any(t.name.startswith("CUDA library") for phase in cpu.phases for t in phase.terms)
