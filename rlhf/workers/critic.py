"""The critic worker: a value model V(s_t) per response token, trained with a clipped value loss.

The value model is a token-classification head with one label on the policy's backbone
(`AutoModelForTokenClassification`, as verl does); starting from a causal-LM checkpoint,
the head is freshly initialised. Value t estimates the return from the state before
response token t is generated, i.e. the model's output at position P+t-1.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Mapping
from typing import Any

import torch
from transformers import AutoModelForTokenClassification

from rlhf.algos import ClippedValueLoss, masked_mean
from rlhf.batch import Batch
from rlhf.signatures import with_defaults
from rlhf.models.loading import ModelSource, hf_model_source, resolve_model_path
from rlhf.workers.fsdp import describe_placement
from rlhf.workers.memory import (
    MemoryEstimate, Placement, Term, Workload, between_updates, dtype_bytes, estimate, forward_terms,
    fsdp_forward_start_terms, fsdp_root_terms, largest, micro_batch, model_shape, trained_model_terms,
    training_activation_terms, update_terms,
)
from rlhf.workers.precision import DType, check_trainable_precision
from rlhf.workers.dispatch import shard, shard_exact
from rlhf.workers.trained_model import TrainsOneModel
from rlhf.workers.training import OptimizerFactory, SchedulerFactory, TrainingSetup


def _value_head_ready(model: torch.nn.Module) -> torch.nn.Module:
    if model.config.pad_token_id is None:
        model.config.pad_token_id = model.config.eos_token_id
    return model


def value_model_source(name_or_path: str, dtype: str = "float32") -> ModelSource:
    """A token-classification model with one label: a value per position."""
    return hf_model_source(AutoModelForTokenClassification, name_or_path, dtype, finish=_value_head_ready,
                           num_labels=1)


def load_value_model(name_or_path: str, dtype: str = "float32") -> torch.nn.Module:
    return value_model_source(name_or_path, dtype).load()


def response_values(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
    """(B,T) values at the positions that predict each response token."""
    t = batch["responses"].shape[1]
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], position_ids=batch["position_ids"],
                use_cache=False)  # else the forward keeps a KV cache of every layer that nothing reads
    return out.logits[:, -t - 1 : -1, 0].float() * batch["response_mask"]


@dataclasses.dataclass(frozen=True)
class CriticPlan:
    """A critic rank's model and training, resolved once from its arguments (`plan_critic`): read by the
    constructor, the memory prediction and the plan line alike."""

    model_path: Any  # a path (or a ModelShape in a memory plan)
    dtype: str  # storage of the trained weights: float32 (master weights)
    training: TrainingSetup
    value_loss: ClippedValueLoss


def plan_critic(
    *, model_path: Any, value_loss: ClippedValueLoss | None, training: TrainingSetup, dtype: str, **_unused: Any,
) -> CriticPlan:
    """The plan of a `CriticWorker` built with these arguments (`_unused`: its optimizer and scheduler)."""
    check_trainable_precision("CriticWorker", dtype, training.compute_dtype)
    return CriticPlan(model_path, dtype, training, value_loss if value_loss is not None else ClippedValueLoss())


class CriticWorker(TrainsOneModel):
    """Computes and trains values on one data-parallel rank."""

    def __init__(
        self,
        model_path: str,
        value_loss: ClippedValueLoss | None = None,  # None means ClippedValueLoss()
        optimizer: OptimizerFactory = torch.optim.AdamW,
        lr_scheduler: SchedulerFactory | None = None,
        training: TrainingSetup = TrainingSetup(),  # placement, compute dtype, batching, clipping, seed (shared)
        dtype: DType = "float32",  # storage of the critic's weights: float32 (master weights; it is trained)
    ):
        self.plan = plan_critic(model_path=model_path, value_loss=value_loss, training=training, dtype=dtype)
        self.value_loss = self.plan.value_loss
        self.trainer = training.trainer(value_model_source(model_path, dtype), optimizer, lr_scheduler, prefix="critic")

    @classmethod
    def resolve_plan(cls, arguments: Mapping[str, Any]) -> CriticPlan:
        """The plan of a worker built with `arguments` (the signature's defaults fill the rest)."""
        return plan_critic(**with_defaults(cls, arguments))

    @classmethod
    def describe_placement(cls, arguments: dict, world_size: int, on_gpu: bool) -> str:
        """The plan's line for this group: strategy, world size, parameter bytes per rank."""
        plan = cls.resolve_plan(arguments)
        model = {"critic": lambda: value_model_source(plan.model_path, plan.dtype)}
        return describe_placement(plan.training.strategy, on_gpu, world_size, model)

    @classmethod
    def predict_memory(cls, arguments: dict, workload: Workload, placement: Placement) -> MemoryEstimate:
        """Peak memory of one rank per phase (rlhf.workers.memory): the value forward and the update over
        whole rows (prompt + response; the value head is one number per token, no vocabulary)."""
        plan = cls.resolve_plan(arguments)
        training = plan.training
        shape, compute = model_shape(plan.model_path), training.compute_dtype
        device, host = trained_model_terms(shape, "value", placement, label="critic")
        rows, width = micro_batch(workload.rows, workload.tokens, training.micro_batch_size,
                                  training.max_tokens_per_forward or training.max_tokens_per_micro_batch)
        hidden = Term("final hidden states", rows * width * shape.hidden * dtype_bytes(compute))
        # the FSDP root group stays gathered from the value forward to the end of the update's backward
        root = fsdp_root_terms(shape, "value", compute, placement, "critic")
        forward = forward_terms(shape, rows, width, compute, placement) + [hidden]
        phases = [("values (no grad)", between_updates(device) + root
                   + largest(forward, fsdp_forward_start_terms(shape, "value", compute, placement)))]
        mini = max(1, workload.rows // max(1, workload.mini_batches))
        rows, width = micro_batch(mini, workload.tokens, training.micro_batch_size, training.max_tokens_per_micro_batch)
        backward = training_activation_terms(shape, rows, width, compute, training.gradient_checkpointing, placement)
        phases.append(("update", update_terms(
            shape, "value", compute, placement, device, backward, math.ceil(mini / rows), "critic",
            recomputed=backward if training.gradient_checkpointing else None)))
        return estimate("critic", phases, host, placement)

    @classmethod
    def preflight(cls, arguments: dict) -> None:
        """Before any stage runs: a trained critic keeps fp32 master weights; its model path resolves."""
        plan = cls.resolve_plan(arguments)
        if isinstance(plan.model_path, str):
            resolve_model_path(plan.model_path)

    @shard
    @torch.no_grad()
    def compute_values(self, batch: Batch) -> Batch:
        """`values` (B,T) before this step's critic update."""
        self.trainer.model.eval()

        def forward(micro: Batch) -> torch.Tensor:
            with self.trainer.autocast():
                return response_values(self.trainer.model, micro)

        return Batch({"values": self.trainer.map_micro_batches(batch, forward)})

    @shard_exact
    def update(self, batch: Batch) -> dict[str, float]:
        """Fit `returns` with the clipped value loss around the rollout-time `values`."""
        start = time.perf_counter()

        def micro_loss(micro: Batch, num_tokens: float, num_seqs: float):
            values = response_values(self.trainer.model, micro)
            loss, raw = self.value_loss(
                values, micro["values"], micro["returns"], micro["response_mask"], num_tokens=num_tokens,
                num_seqs=num_seqs, max_new_tokens=micro.require_meta("max_new_tokens", "CriticWorker"),
            )
            metrics = {f"critic/{k}": v for k, v in raw.items()}
            metrics["critic/vpred_mean"] = masked_mean(values.detach(), micro["response_mask"])
            return loss, metrics

        out = self.trainer.update(batch, micro_loss)
        out["timing_s/update_critic_worker"] = time.perf_counter() - start
        return out

