"""The reward-model worker: a sequence-classification model that scores (prompt, response) pairs.

The reward model has its own tokenizer and chat template, so the policy's token ids are never
reused: each row is re-rendered from the chat messages (`raw_prompt`, from
`PromptDataset(raw_prompt=True)`) plus the policy's decoded response (`response_text`, from
scoring) as the assistant turn, with the reward model's template, and scored at its last token
(`AutoModelForSequenceClassification`, one label, as verl's reward-model worker and the
Skywork / ArmoRM reward models do). Inference only: nothing here trains.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from transformers import AutoModelForSequenceClassification, PreTrainedTokenizerBase

from rlhf.batch import Batch
from rlhf.ranges import PositiveInt
from rlhf.signatures import with_defaults
from rlhf.data.tokenize import left_pad, position_ids
from rlhf.models.loading import ModelSource, hf_model_source, load_tokenizer, resolve_model_path
from rlhf.workers.fsdp import describe_placement
from rlhf.workers.memory import (
    MemoryEstimate, Placement, Term, Workload, dtype_bytes, estimate, forward_terms, frozen_model_terms,
    fsdp_forward_start_terms, largest, model_shape,
)
from rlhf.workers.dispatch import shard
from rlhf.workers.training import ModelTrainer, TrainingSetup


def _reward_head_ready(model: torch.nn.Module) -> torch.nn.Module:
    if model.config.pad_token_id is None:
        model.config.pad_token_id = model.config.eos_token_id
    return model.eval().requires_grad_(False)


def reward_model_source(name_or_path: str, dtype: str = "float32") -> ModelSource:
    """A one-label sequence-classification model in `dtype`, in eval mode, with a pad token id set."""
    return hf_model_source(AutoModelForSequenceClassification, name_or_path, dtype, finish=_reward_head_ready,
                           num_labels=1)


def load_reward_model(name_or_path: str, dtype: str = "float32") -> torch.nn.Module:
    return reward_model_source(name_or_path, dtype).load()


def conversation_ids(
    tokenizer: PreTrainedTokenizerBase, messages: Sequence[dict], response: str, max_length: int
) -> list[int]:
    """Token ids of `messages` + the assistant `response` in the tokenizer's chat template.

    Longer conversations keep their last `max_length` tokens: the score is read at the last one.
    """
    chat = [*messages, {"role": "assistant", "content": response}]
    text = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=False)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return ids[-max_length:]


@dataclasses.dataclass(frozen=True)
class RewardModelPlan:
    """A reward-model rank's model and scoring, resolved once from its arguments (`plan_reward_model`): read
    by the constructor, the memory prediction and the plan line alike."""

    model_path: Any  # a path (or a ModelShape in a memory plan)
    tokenizer_path: Any  # the tokenizer with the chat template: its own path, or the model's
    training: TrainingSetup  # strategy and micro-batch size; the frozen weights are stored in its compute dtype
    max_length: int  # tokens per conversation after the chat template

    @property
    def dtype(self) -> str:
        return self.training.compute_dtype


def plan_reward_model(
    *, model_path: Any, tokenizer_path: Any, training: TrainingSetup, max_length: int,
) -> RewardModelPlan:
    """The plan of a `RewardModelWorker` built with these arguments."""
    return RewardModelPlan(model_path, tokenizer_path or model_path, training, max_length)


class RewardModelWorker:
    """Scores responses with a reward model on one data-parallel rank."""

    def __init__(
        self,
        model_path: str,  # a sequence-classification reward model (hub id or local folder)
        tokenizer_path: str | None = None,  # its tokenizer with the chat template; None: model_path
        # strategy, micro_batch_size (conversations per forward pass) and compute_dtype, which the frozen
        # weights are stored in, as the reference policy's; a recipe passes the policy's own node
        training: TrainingSetup = TrainingSetup(micro_batch_size=16),
        max_length: PositiveInt = 2048,  # tokens per conversation after the chat template (left part cut)
    ):
        self.plan = plan_reward_model(model_path=model_path, tokenizer_path=tokenizer_path, training=training,
                                      max_length=max_length)
        self.tokenizer = load_tokenizer(self.plan.tokenizer_path)
        self.trainer = ModelTrainer(  # not training.trainer(): a frozen model leaves torch's seed alone
            reward_model_source(model_path, self.plan.dtype), None, setup=training, prefix="reward_model",
        )
        self.max_length = max_length

    @classmethod
    def resolve_plan(cls, arguments: Mapping[str, Any]) -> RewardModelPlan:
        """The plan of a worker built with `arguments` (the signature's defaults fill the rest)."""
        return plan_reward_model(**with_defaults(cls, arguments))

    @classmethod
    def describe_placement(cls, arguments: dict, world_size: int, on_gpu: bool) -> str:
        """The plan's line for this group: strategy, world size, parameter bytes per rank."""
        plan = cls.resolve_plan(arguments)
        model = {"reward model": lambda: reward_model_source(plan.model_path, plan.dtype)}
        return describe_placement(plan.training.strategy, on_gpu, world_size, model)

    @classmethod
    def predict_memory(cls, arguments: dict, workload: Workload, placement: Placement) -> MemoryEstimate:
        """Peak memory of one rank (rlhf.workers.memory): the frozen model in the compute dtype and one
        scoring forward of `micro_batch_size` conversations of prompt + response tokens (the template adds
        a few; at most `max_length`)."""
        plan = cls.resolve_plan(arguments)
        shape, compute = model_shape(plan.model_path), plan.dtype
        device = frozen_model_terms(shape, "score", compute, placement, "reward model")
        rows = min(plan.training.micro_batch_size, max(1, workload.rows))
        width = min(plan.max_length, workload.tokens + 32)
        hidden = Term("final hidden states", rows * width * shape.hidden * dtype_bytes(compute))
        forward = forward_terms(shape, rows, width, compute, placement) + [hidden]
        start = fsdp_forward_start_terms(shape, "score", compute, placement)  # its first forward gathers the root
        return estimate("reward_model", [("score (no grad)", device + largest(forward, start))], placement=placement)

    @classmethod
    def preflight(cls, arguments: dict) -> None:
        """Before any stage runs: the model (and tokenizer) paths must resolve."""
        plan = cls.resolve_plan(arguments)
        for path in (plan.model_path, plan.tokenizer_path):
            if isinstance(path, str):
                resolve_model_path(path)

    @shard
    @torch.no_grad()
    def score(self, batch: Batch) -> Batch:
        """`rm_scores` (B,): the reward model's score of each (raw_prompt, response_text) row."""
        for key, fix in (
            ("raw_prompt", "build the PromptDataset with raw_prompt=True"),
            ("response_text", "score after decoding (rlhf.trainers.scoring.score_rollout adds it)"),
        ):
            if key not in batch:
                raise KeyError(f"RewardModelWorker.score needs the non-tensor column {key!r}. Fix: {fix}.")
        ids = [
            conversation_ids(self.tokenizer, messages, text, self.max_length)
            for messages, text in zip(batch["raw_prompt"], batch["response_text"])
        ]
        return Batch({"rm_scores": self.score_ids(ids)})

    def score_ids(self, ids: Sequence[Sequence[int]]) -> torch.Tensor:
        """(B,) float32 scores of already tokenised conversations, in micro-batches.

        Left padding puts every row's last token at the last position, where the model pools.
        """
        model, size = self.trainer.model, self.trainer.setup.micro_batch_size
        parts = []
        for start in range(0, len(ids), size):
            input_ids, mask = left_pad(ids[start : start + size], self.tokenizer.pad_token_id)
            out = model(
                input_ids=input_ids.to(self.trainer.device),
                attention_mask=mask.to(self.trainer.device),
                position_ids=position_ids(mask).to(self.trainer.device),
                use_cache=False,  # else the forward keeps a KV cache of every layer that nothing reads
            )
            parts.append(out.logits[:, 0].float().cpu())
        return torch.cat(parts) if parts else torch.zeros(0)
