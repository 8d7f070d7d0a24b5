"""A policy rank's peak memory per phase of a step, from its plan (`rlhf.workers.policy_plan`) alone.

The terms are `rlhf.workers.memory`'s; what this module decides is which of them a policy rank holds
in each phase (generation, no-grad log-probs, update), read from the same plan the worker is built
from: the actor (trained in fp32 with its optimizer state, or frozen), a reference policy of its own,
a teacher (on-policy distillation: frozen like the reference, of its own shape, with its no-grad forward
in the log-prob phase), the rollout engine (sharing the actor, a copy of its own in its dtype, or vLLM's
share of the device).
"""

from __future__ import annotations

import dataclasses
import math

from rlhf.rollout.vllm_engine import device_share
from rlhf.workers.memory import (
    MemoryEstimate, ModelShape, Placement, Term, Workload, between_updates, estimate, forward_terms,
    frozen_model_terms, fsdp_forward_start_terms, fsdp_root_terms, generation_terms, largest, log_prob_block_terms,
    logit_terms, micro_batch, model_shape, shared_prefix_backward_terms, shared_prefix_forward_terms,
    shared_prefix_training_terms, trained_model_terms, training_activation_terms, update_terms,
)
from rlhf.workers.policy_plan import PolicyPlan

__all__ = ["predict_policy_memory"]

HEAD = "lm"


def predict_policy_memory(plan: PolicyPlan, workload: Workload, placement: Placement) -> MemoryEstimate:
    """Peak memory of one rank per phase of a step (rlhf.workers.memory)."""
    shape = model_shape(plan.model_path)
    device, host = _held(plan, shape, placement, workload.generate)
    # a trained actor's FSDP root group stays gathered from its first forward to the end of its backward
    root = fsdp_root_terms(shape, HEAD, plan.compute_dtype, placement, "actor") if plan.trained else []
    phases = []
    if workload.generate:
        phases.append(("generation", between_updates(device) + _generation(plan, shape, workload, placement, root)))
    phases.append(("log-probs (no grad)", between_updates(device) + root + _log_probs(plan, shape, workload, placement)))
    if plan.trained:
        phases.append(("update", _update(plan, shape, workload, placement, device)))
    return estimate("policy", phases, host, placement)


def _held(plan: PolicyPlan, shape: ModelShape, placement: Placement, generates: bool) -> tuple[list[Term], list[Term]]:
    """(device, host) terms held through the step: the actor, a reference of its own, a teacher, the engine's copy."""
    if plan.trained:
        device, host = trained_model_terms(shape, HEAD, placement, optimizer_states=0 if plan.adapter else 2,
                                           label="actor")
        if plan.adapter:  # an adapter's gradients and optimizer state are a small fraction of the base
            device = [t for t in device if "gradients" not in t.name and "DDP" not in t.name]
    else:
        device, host = frozen_model_terms(shape, HEAD, plan.dtype, placement, "actor"), []
    if plan.reference_model:  # a LoRA reference that is the actor's base costs nothing
        device += frozen_model_terms(model_shape(plan.ref_model_path), HEAD, plan.compute_dtype, placement, "reference")
    if plan.teacher_model:  # a sibling of the reference, of its own shape (a teacher is often larger)
        teacher = model_shape(plan.teacher_model_path)
        device += frozen_model_terms(teacher, HEAD, plan.compute_dtype, placement, "teacher")
    if plan.engine_copy and plan.engine.decodes_in_process:  # its own unsharded copy; its sleep frees nothing
        device += frozen_model_terms(shape, HEAD, plan.engine.dtype, _unsharded(placement), "rollout engine")
    elif plan.engine_copy and generates and placement.device != "cuda":  # vLLM's CPU build cannot sleep:
        device += _vllm_share(plan, placement)  # its share stays through the update
    return device, host


def _unsharded(placement: Placement) -> Placement:
    return Placement(placement.device, 1, device_bytes=placement.device_bytes)


def _vllm_share(plan: PolicyPlan, placement: Placement) -> list[Term]:
    share = device_share(plan.engine.options.get("gpu_memory_utilization"), placement.device == "cuda")
    return [Term(f"vLLM share ({share:g} of the device)", share * (placement.device_bytes or 0))]


def _generation(
    plan: PolicyPlan, shape: ModelShape, workload: Workload, placement: Placement, root: list[Term],
) -> list[Term]:
    """What decoding adds: the transformers engine's KV cache and copies (with the actor's module, under
    FSDP its gathered root, or its own copy), or vLLM's share of a GPU (on a CPU it is held already)."""
    if not plan.engine.decodes_in_process:
        return _vllm_share(plan, placement) if placement.device == "cuda" else []
    n, options = workload.n, plan.engine.options
    per_call = options.get("max_rows_per_call")
    rows = workload.rows if per_call is None else min(workload.rows, max(n, per_call // n * n))
    # gradient checkpointing hooks the actor's layers, so decoding with them falls back to the model's forward
    lean = options.get("lean") is not False and not options.get("use_generate") \
        and not (plan.engine.shares_actor and plan.training.gradient_checkpointing)
    prompts, p, r = max(1, rows // n), workload.prompt_tokens, workload.response_tokens
    if plan.engine_copy:  # its own weights, in its dtype, unsharded and outside the actor's autocast
        dtype = plan.engine.dtype
        return generation_terms(shape, rows, prompts, p, r, dtype, dtype, _unsharded(placement), lean=lean)
    gen = generation_terms(shape, rows, prompts, p, r, plan.compute_dtype, plan.dtype, placement, lean=lean)
    return root + largest(gen, fsdp_forward_start_terms(shape, HEAD, plan.compute_dtype, placement))


def _log_probs(plan: PolicyPlan, shape: ModelShape, workload: Workload, placement: Placement) -> list[Term]:
    """One no-grad forward micro-batch (old, reference or teacher log-probs) and its logits: the larger of the
    actor's and the teacher's (whose top-k needs its full logits, not the fused head)."""
    moments = [_no_grad_forward(plan, shape, workload, placement, plan.fused_lm_head)]
    if plan.teacher_model:
        teacher = model_shape(plan.teacher_model_path)
        moments.append(_no_grad_forward(plan, teacher, workload, placement,
                                        plan.fused_lm_head and not plan.teacher_top_k, "teacher "))
    return largest(*moments)


def _no_grad_forward(plan: PolicyPlan, shape: ModelShape, workload: Workload, placement: Placement, fused: bool,
                     label: str = "") -> list[Term]:
    training, compute = plan.training, plan.compute_dtype
    p, r, n = workload.prompt_tokens, workload.response_tokens, workload.n
    rows, width = micro_batch(workload.rows, workload.tokens, training.micro_batch_size,
                              training.max_tokens_per_forward or training.max_tokens_per_micro_batch)
    if plan.shared_prefix and n > 1:
        fwd = shared_prefix_forward_terms(shape, rows, max(1, rows // n), p, r, compute)
    else:
        fwd = forward_terms(shape, rows, width, compute, placement)
    fwd = fwd + logit_terms(shape, rows, r, compute, fused, False, placement.device, plan.logits_block_elements)
    if label:
        fwd = [dataclasses.replace(t, name=label + t.name) for t in fwd]
    return largest(fwd, fsdp_forward_start_terms(shape, HEAD, compute, placement))


def _update(
    plan: PolicyPlan, shape: ModelShape, workload: Workload, placement: Placement, device: list[Term],
) -> list[Term]:
    """The update's largest moment over its micro-batches of one mini-batch."""
    training, compute = plan.training, plan.compute_dtype
    p, r, n = workload.prompt_tokens, workload.response_tokens, workload.n
    mini = max(1, workload.rows // max(1, workload.mini_batches))
    rows, width = micro_batch(mini, workload.tokens, training.micro_batch_size, training.max_tokens_per_micro_batch)
    late = None
    if plan.shared_prefix and n > 1:
        acts = shared_prefix_training_terms(shape, rows, max(1, rows // n), p, r, compute)
        if not plan.adapter:  # an adapter's gradients are a small fraction of the base
            late = shared_prefix_backward_terms(acts[0], shape.parameters(HEAD))
    else:
        acts = training_activation_terms(shape, rows, width, compute, training.gradient_checkpointing, placement)
    # a top-k distillation loss reads the teacher's tokens from the full logits: the model's own head, not fused
    fused = plan.fused_lm_head and not plan.teacher_top_k
    backward = acts + logit_terms(shape, rows, r, compute, fused, True, placement.device,
                                  plan.logits_block_elements, with_blocks=False)
    blocks = log_prob_block_terms(shape, rows, r, True, placement.device, plan.logits_block_elements)
    return update_terms(shape, HEAD, compute, placement, device, backward, math.ceil(mini / rows), "actor",
                        frozen_base=plan.adapter, blocks=blocks, late_backward=late,
                        recomputed=acts if training.gradient_checkpointing else None)
