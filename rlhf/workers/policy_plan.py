"""What a policy worker holds and how it computes, decided once from its arguments (`plan_policy`).

The constructor builds what the plan says, the memory planner counts what it says
(`rlhf.workers.policy_memory`) and the plan line names it (`PolicyWorker.describe_placement`):
one function decides whether the engine shares the actor's module or keeps its own copy (and in
which dtype), whether the reference policy is the adapted actor's base or a model of its own, whether a
frozen teacher (on-policy distillation) sits beside them and how many top-k tokens it returns,
whether a group's shared prompt is encoded once and whether the LM head is fused into the
log-prob kernel. Before, each of those read the arguments again and they drifted apart (an
engine with its own bf16 copy was built, but not counted).

Pure: nothing is loaded. `model_path`, `ref_model_path` and `teacher_model_path` may be `ModelShape`s
instead of paths (tests, `rlhf plan --memory`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from rlhf.models.loading import same_model
from rlhf.rollout.engine import EngineChoice, EngineFactory, choose_engine
from rlhf.workers.fsdp import FSDP, resolve_strategy
from rlhf.workers.precision import check_trainable_precision
from rlhf.workers.training import TrainingSetup

__all__ = ["SHARED_REFERENCE", "PolicyPlan", "plan_policy", "reference_is_base"]

SHARED_REFERENCE = "reference = the actor's base with its adapter disabled (no second copy: 0 MB)"


def reference_is_base(adapter: Any, ref_model_path: Any, model_path: Any) -> bool:
    """Whether the reference policy is the adapted actor's own base model (then the actor with its adapter
    disabled serves as the reference). Paths not known yet (an earlier stage's output) count as different;
    the same object given twice (a `ModelShape` in a memory plan) is the same model."""
    if adapter is None or ref_model_path is None:
        return False
    if ref_model_path is model_path:
        return True
    if not isinstance(ref_model_path, str) or not isinstance(model_path, str):
        return False
    try:
        return same_model(ref_model_path, model_path)
    except (OSError, ValueError):  # not there (yet): the preflight names it
        return ref_model_path == model_path


@dataclasses.dataclass(frozen=True)
class PolicyPlan:
    """One policy rank's models and computation, resolved from the worker's arguments."""

    model_path: Any  # a path (or a ModelShape in a memory plan)
    ref_model_path: Any  # the same, or None: no reference policy
    training: TrainingSetup
    dtype: str  # the actor's storage dtype
    trained: bool  # it has an objective (else inference only: no optimizer, the engine never sleeps)
    adapter: bool  # only an adapter trains (LoRA); the base is frozen
    reference_is_base: bool  # the reference is the actor with its adapter disabled: no second model
    engine: EngineChoice  # shares the actor's module, or holds its own copy in `engine.dtype`
    fsdp: bool  # the strategy resolved to FSDP on this device
    shared_prefix: bool  # a group's shared prompt is encoded once (log-probs and update)
    fused_lm_head: bool  # the LM head is applied inside the log-prob kernel where the head allows it
    fused_lm_head_required: bool  # ... and the head must allow it (asked for explicitly)
    keep_logits: bool  # the fused head keeps its logits for backward (CPU: compute first) or recomputes (GPU)
    logits_block_elements: int | None  # float32 elements per log-prob block; None: per device
    teacher_model_path: Any = None  # a frozen teacher (on-policy distillation), stored like the reference; None: none
    teacher_top_k: int = 0  # tokens per position the teacher returns for a top-k loss of the objective; 0: none
    # rows whose advantages are all 0 are left out of the update's forward and backward (the objective says they
    # add nothing: `PolicyObjective.skips_inert_rows`)
    skip_inert_rows: bool = False

    @property
    def compute_dtype(self) -> str:
        return self.training.compute_dtype

    @property
    def reference_model(self) -> bool:
        """A frozen reference model of its own is loaded (in the compute dtype)."""
        return self.ref_model_path is not None and not self.reference_is_base

    @property
    def teacher_model(self) -> bool:
        """A frozen teacher is loaded (in the compute dtype, sharded like the reference)."""
        return self.teacher_model_path is not None

    @property
    def engine_copy(self) -> bool:
        """The engine holds a second copy of the weights, which the actor's are streamed into after updates."""
        return not self.engine.shares_actor


def _teacher_top_k(objective: Any) -> int:
    """k of the objective's top-k distillation loss (`PolicyObjective.distill_loss`), 0 without one; reads the
    objective or its unbuilt graph node alike (the memory preflight plans from nodes)."""
    loss = getattr(objective, "distill_loss", None)
    k = getattr(loss, "k", 0) if loss is not None else 0
    return k if isinstance(k, int) else 0


def plan_policy(
    *, model_path: Any, objective: Callable | None, ref_model_path: Any, engine: EngineFactory,
    training: TrainingSetup, dtype: str, logits_block_elements: int | None, fused_lm_head: bool | None,
    adapter: Callable | None, shared_prefix: bool | None, on_gpu: bool, teacher_model_path: Any = None,
    **_unused: Any,
) -> PolicyPlan:
    """The plan of a `PolicyWorker` built with these arguments on a device with (`on_gpu`) or without a GPU.
    Raises ValueError on settings that contradict each other, naming the fix. `_unused`: the worker's other
    arguments (optimizer, scheduler), which change nothing here."""
    trained = objective is not None
    if trained:
        check_trainable_precision("PolicyWorker", dtype, training.compute_dtype)
    if getattr(objective, "needs_ref", False) and ref_model_path is None:
        raise ValueError(
            "the policy objective needs a reference policy (a KL loss, or a DPO-family loss), but "
            "PolicyWorker.ref_model_path is None. Set ref_model_path (usually the initial model path), or remove "
            "the KL loss (or use a reference-free loss such as SimPOLoss)."
        )
    teacher_top_k = _teacher_top_k(objective)
    if teacher_top_k and teacher_model_path is None:
        raise ValueError(
            f"the policy objective has a top-k distillation loss (k={teacher_top_k}) but PolicyWorker."
            "teacher_model_path is None. Set teacher_model_path to the teacher's model folder, or remove "
            "the objective's distill_loss."
        )
    if shared_prefix and training.gradient_checkpointing:
        raise ValueError("PolicyWorker: shared_prefix=True needs a KV cache, which gradient_checkpointing=True "
                         "turns off in training; set one of them to False")
    fsdp = isinstance(resolve_strategy(training.strategy, on_gpu), FSDP)
    # Under FSDP the two passes of a shared-prefix forward have not been run on GPUs yet;
    # gradient checkpointing turns off the KV cache the shared-prefix forward needs.
    if shared_prefix is None:
        shared_prefix = not fsdp and not training.gradient_checkpointing
    return PolicyPlan(
        model_path=model_path, ref_model_path=ref_model_path, training=training, dtype=dtype, trained=trained,
        adapter=adapter is not None, reference_is_base=reference_is_base(adapter, ref_model_path, model_path),
        engine=choose_engine(engine, training.compute_dtype, gpu=on_gpu), fsdp=fsdp, shared_prefix=shared_prefix,
        fused_lm_head=fused_lm_head is None or fused_lm_head, fused_lm_head_required=fused_lm_head is True,
        # a CPU has memory to spare and compute to save: keep the logits, turned into their gradient in
        # place (one (B,T,V) tensor, where the model's own head allocates two); a GPU recomputes them
        keep_logits=not on_gpu, logits_block_elements=logits_block_elements,
        teacher_model_path=teacher_model_path, teacher_top_k=teacher_top_k,
        skip_inert_rows=trained and getattr(objective, "skips_inert_rows", False) is True,
    )
