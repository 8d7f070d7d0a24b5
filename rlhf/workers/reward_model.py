"""The reward-model worker: a one-label sequence-classification model that scores conversations, and trains
on preference pairs when it is given a loss.

Scoring in RL: the reward model has its own tokenizer and chat template, so the policy's token ids are
never reused: each row is re-rendered from the chat messages (`raw_prompt`, from
`PromptDataset(raw_prompt=True)`) plus the policy's decoded response (`response_text`, from scoring) as
the assistant turn, with the reward model's template (`AutoModelForSequenceClassification`, one label, as
verl's reward-model worker and the Skywork / ArmoRM reward models do). A folder that carries the reward
mean and std of its training data (`reward_mean`, `reward_std` in config.json, as OpenRLHF stores them)
gives normalised scores, (r - mean) / std, unless `normalize=False`.

Training (`RewardModelTrainer`, rlhf.trainers.reward_model): the same model class started from any causal
LM (a policy or SFT checkpoint), whose fresh score head is drawn from the setup's seed, trained by the
policy's and critic's `ModelTrainer` (FSDP2 or DDP, token-budget micro-batches, precision, LoRA) on
`PreferenceDataset` batches (chosen at row 2i, rejected at 2i+1) with a pairwise loss from rlhf.algos
(Bradley-Terry). A pair's two rows always share a micro-batch: the loss needs both scores.

Either way the score is the head's output at each row's last real token (by attention mask, whatever
the padding and the pad token id), and a head that the folder does not hold is an error, never a random
initialisation: only a stage that trains starts a head afresh.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from transformers import AutoModelForSequenceClassification, PreTrainedTokenizerBase

from rlhf.algos import split_pairs
from rlhf.batch import Batch
from rlhf.data.tokenize import left_pad, position_ids
from rlhf.models.kv_cache import cache_kwargs
from rlhf.models.loading import ModelSource, hf_model_source, load_tokenizer, model_reference, resolve_model_path
from rlhf.models.shared_prefix import encode_prompts_once
from rlhf.ranges import PositiveInt
from rlhf.signatures import with_defaults
from rlhf.workers.adapter_save import save_merged_and_adapter
from rlhf.workers.dispatch import on_all_ranks, shard, shard_exact
from rlhf.workers.fsdp import FSDP, describe_placement
from rlhf.workers.memory import (
    MemoryEstimate, Placement, Term, Workload, between_updates, dtype_bytes, estimate, forward_terms,
    frozen_model_terms, fsdp_forward_start_terms, fsdp_root_terms, largest, micro_batch, model_shape,
    trained_model_terms, training_activation_terms, update_terms,
)
from rlhf.workers.lora import set_base_model
from rlhf.workers.micro_batches import restore_order
from rlhf.workers.precision import DType, check_trainable_precision
from rlhf.workers.trained_model import TrainsOneModel
from rlhf.workers.training import ModelTrainer, OptimizerFactory, SchedulerFactory, TrainingSetup

STATS_KEYS = ("reward_mean", "reward_std")
"""Where a trained reward model's folder keeps the reward mean and std over its training data (config.json)."""


class MissingRewardHeadError(ValueError):
    """A reward model's folder lacks weights that transformers would silently initialise at random."""


def _missing_weights_check(path: str, new_head: bool) -> Callable[[torch.nn.Module, list[str]], None]:
    """What to do with the keys `from_pretrained` could not find in `path`: none may be missing, except,
    where a stage trains the head afresh (`new_head`), the head's own (those outside the backbone)."""

    def check(model: torch.nn.Module, missing: list[str]) -> None:
        backbone = f"{model.base_model_prefix}."
        bad = [k for k in missing if k.startswith(backbone)] if new_head else list(missing)
        if not bad:
            if missing:
                print(f"[reward model] {path}: a new score head ({', '.join(missing)}), drawn from the training seed",
                      flush=True)
            return
        head = [k for k in bad if not k.startswith(backbone)]
        if head and len(head) == len(bad):
            raise MissingRewardHeadError(
                f"{path} has no trained reward head ({', '.join(head)} missing): transformers would initialise it "
                "at random and every score would be noise. It looks like a language model, not a reward model. "
                "Fix: train a reward model from it first (`rlhf rm MODEL --data PAIRS`, or "
                "rlhf_configs.reward_model.rm_stage) and pass that stage's `final/` folder."
            )
        raise MissingRewardHeadError(
            f"{path} lacks {len(bad)} weight(s) of the model ({', '.join(bad[:5])}{' ...' if len(bad) > 5 else ''}); "
            "transformers would initialise them at random. Fix: point at a complete model folder (config.json with "
            "all its safetensors files)."
        )

    return check


def reward_model_source(
    name_or_path: str, dtype: str = "float32", new_head: bool = False, pad_token_id: int | None = None,
) -> ModelSource:
    """A one-label sequence-classification model in `dtype` with a pad token id set (the tokenizer's,
    else EOS). `new_head`: the folder may lack the score head (a causal LM a reward-model stage starts
    from; the head is drawn from torch's generator, which the setup seeds); otherwise every weight must
    be in the folder (`MissingRewardHeadError`)."""

    def ready(model: torch.nn.Module) -> torch.nn.Module:
        if model.config.pad_token_id is None:
            model.config.pad_token_id = pad_token_id if pad_token_id is not None else model.config.eos_token_id
        return model

    return hf_model_source(AutoModelForSequenceClassification, name_or_path, dtype, finish=ready, num_labels=1,
                           on_missing=_missing_weights_check(name_or_path, new_head))


def load_reward_model(name_or_path: str, dtype: str = "float32") -> torch.nn.Module:
    """A trained reward model, whole (every weight from the folder), in eval mode."""
    return reward_model_source(name_or_path, dtype).load().eval().requires_grad_(False)


def reward_stats(config: Any) -> tuple[float, float] | None:
    """(mean, std) a trained reward model's config carries, or None (a model trained elsewhere)."""
    values = [getattr(config, key, None) for key in STATS_KEYS]
    if any(not isinstance(v, (int, float)) for v in values):
        return None
    mean, std = float(values[0]), float(values[1])
    return (mean, std) if math.isfinite(mean) and math.isfinite(std) and std > 0 else None


def conversation_ids(
    tokenizer: PreTrainedTokenizerBase, messages: Sequence[dict], response: str, max_length: int
) -> list[int]:
    """Token ids of `messages` + the assistant `response` in the tokenizer's chat template, ending at the
    response's end-of-turn token: whitespace the template puts after it (ChatML's newline) is left out, as the
    preference data leaves it out (rlhf.data.sft.conversation_ids), so a reward model trained here reads an RL
    sample's score where it read its training pairs'.

    Longer conversations keep their last `max_length` tokens: the score is read at the last one.
    """
    chat = [*messages, {"role": "assistant", "content": response}]
    text = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=False)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    special = set(tokenizer.all_special_ids)
    end = len(ids)
    while end and ids[end - 1] not in special and not tokenizer.decode(ids[end - 1 : end]).strip():
        end -= 1
    if end and ids[end - 1] in special:  # only whitespace after the last special token: drop it
        ids = ids[:end]
    return ids[-max_length:]


def score_head(model: torch.nn.Module) -> torch.nn.Module:
    """The sequence-classification head (`score` in Llama/Qwen2/Mistral...), also inside DDP, FSDP or PEFT
    wrappers: the shallowest module named `score` or `classifier`."""
    found = [(name.count("."), name, m) for name, m in model.named_modules()
             if name.rsplit(".", 1)[-1] in ("score", "classifier")]
    if not found:
        raise ValueError(f"{type(model).__name__} has no `score` (or `classifier`) head: not a sequence-classification "
                         "model")
    return min(found, key=lambda f: (f[0], f[1]))[2]


def last_token_scores(model: torch.nn.Module, head: torch.nn.Module, input_ids: torch.Tensor,
                      attention_mask: torch.Tensor, position_ids: torch.Tensor, response_length: int = 0,
                      prefix_model: torch.nn.Module | None = None) -> torch.Tensor:
    """(B,) float32: the head's output at each row's last real token (the last 1 of `attention_mask`).

    Read from the head's per-token output (a forward hook) rather than transformers' pooled one, which
    takes the last token whose id is not the pad id: a row ending in the pad token (SmolLM2's pad is
    its end-of-turn token) would be read one token early, and left and right padding would differ.
    `response_length` R > 0: the rows are [left-padded prompt | right-padded response] (a preference pair's two
    rows share their prompt), and each distinct prompt is encoded once (rlhf.models.shared_prefix; the same
    scores up to float rounding, a pair costs one prompt instead of two); `prefix_model` as there (under DDP).
    """
    seen: list[torch.Tensor] = []
    handle = head.register_forward_hook(lambda module, args, out: seen.append(out))
    try:
        shared = None
        if response_length > 0 and bool(attention_mask[:, -response_length:].any(dim=1).all()):
            shared = encode_prompts_once(model, input_ids, attention_mask, position_ids, response_length,
                                         prefix_model)
        if shared is None:
            model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                  use_cache=False)  # else the forward keeps a KV cache of every layer that nothing reads
        else:  # every row has a response token, so its last real token is one of the R response positions
            p = input_ids.shape[1] - response_length
            model(input_ids=input_ids[:, p:], attention_mask=attention_mask, position_ids=position_ids[:, p:],
                  use_cache=True, **cache_kwargs(model, shared[1]))
            attention_mask = attention_mask[:, p:]
    finally:
        handle.remove()
    per_token = seen[-1][..., 0].float()  # (B, T), or (B, R) after a shared prompt
    last = attention_mask.shape[1] - 1 - (attention_mask != 0).flip(1).int().argmax(dim=1)
    return per_token.gather(1, last[:, None]).squeeze(1)


def pair_ranks(batch: Batch, where: str) -> None:
    """Check that rows 2i and 2i+1 are a pair (one `uid`, none shared with another pair); else raise."""
    if len(batch) % 2:
        raise ValueError(f"{where}: a preference batch has 2 rows per pair (chosen, rejected); got {len(batch)} rows")
    if "uid" in batch.non_tensors:
        uid = [str(u) for u in batch["uid"]]
        if any(uid[i] != uid[i + 1] for i in range(0, len(uid), 2)) or len(set(uid)) != len(uid) // 2:
            raise ValueError(f"{where}: rows 2i and 2i+1 must be one pair (chosen, rejected) with a uid of their own; "
                             "a pair was split or reordered (shard preference batches by whole pairs)")


@dataclasses.dataclass(frozen=True)
class RewardModelPlan:
    """A reward-model rank's model and work, resolved once from its arguments (`plan_reward_model`): read
    by the constructor, the memory prediction and the plan line alike."""

    model_path: Any  # a path (or a ModelShape in a memory plan)
    tokenizer_path: Any  # the tokenizer with the chat template: its own path, or the model's
    training: TrainingSetup  # strategy, micro-batches, compute dtype (a frozen model is stored in it)
    max_length: int  # tokens per conversation after the chat template
    trained: bool  # a loss was given: fp32 master weights and an optimizer
    dtype: str  # storage of the weights: `dtype` when trained, else the compute dtype


def plan_reward_model(
    *, model_path: Any, tokenizer_path: Any, training: TrainingSetup, max_length: int, loss: Any = None,
    dtype: str = "float32", adapter: Any = None, **_unused: Any,
) -> RewardModelPlan:
    """The plan of a `RewardModelWorker` built with these arguments (`_unused`: its optimizer, scheduler...)."""
    trained = loss is not None
    if adapter is not None and not trained:
        raise ValueError("RewardModelWorker: an adapter is for training (give a loss); a reward model that only "
                         "scores loads its merged folder")
    if trained:
        check_trainable_precision("RewardModelWorker", dtype, training.compute_dtype)
    return RewardModelPlan(model_path, tokenizer_path or model_path, training, max_length, trained,
                           dtype if trained else training.compute_dtype)


class RewardModelWorker(TrainsOneModel):
    """Scores conversations with a reward model on one data-parallel rank; trains it when given a `loss`."""

    def __init__(
        self,
        model_path: str,  # a sequence-classification reward model; with a loss, any causal LM too (hub id or folder)
        tokenizer_path: str | None = None,  # its tokenizer with the chat template; None: model_path
        # strategy, micro_batch_size (conversations per forward pass) and compute_dtype, which frozen weights are
        # stored in, as the reference policy's; a recipe passes the policy's own node
        training: TrainingSetup = TrainingSetup(micro_batch_size=16),
        max_length: PositiveInt = 2048,  # tokens per conversation after the chat template (left part cut)
        normalize: bool = True,  # RL scores as (r - reward_mean) / reward_std where the folder stores them
        # a pairwise loss (rlhf.algos: Bradley-Terry) called as loss(chosen, rejected, margin, num_pairs=...);
        # None: inference only (every weight must be in the folder)
        loss: Callable | None = None,
        optimizer: OptimizerFactory = torch.optim.AdamW,  # called with the trainable parameters
        lr_scheduler: SchedulerFactory | None = None,  # called with the optimizer; stepped per optimizer step
        dtype: DType = "float32",  # storage of trained weights: float32 (master weights)
        adapter: Callable[[torch.nn.Module], torch.nn.Module] | None = None,  # e.g. LoRA(rank=8): train an adapter
        # a pair's prompt encoded once in training and held-out scoring; None: on except under FSDP or with
        # gradient checkpointing (which turns off the KV cache it needs)
        shared_prefix: bool | None = None,
    ):
        self.plan = plan_reward_model(model_path=model_path, tokenizer_path=tokenizer_path, training=training,
                                      max_length=max_length, loss=loss, dtype=dtype, adapter=adapter)
        self.tokenizer = load_tokenizer(self.plan.tokenizer_path)
        source = reward_model_source(model_path, self.plan.dtype, new_head=loss is not None,
                                     pad_token_id=self.tokenizer.pad_token_id)
        if loss is None:  # not training.trainer(): a frozen model leaves torch's seed alone
            self.trainer = ModelTrainer(source, None, setup=training, prefix="reward_model")
        else:  # seeded first: the fresh head (and an adapter) start the same in every run and on every rank
            self.trainer = training.trainer(source.wrapped(adapter) if adapter is not None else source, optimizer,
                                            lr_scheduler, prefix="rm")
        self.loss = loss
        self.adapter = adapter
        self.base_model = model_reference(model_path)  # what a saved adapter names as its base
        if adapter is not None:  # (FSDP builds the module without a path, so PEFT could not know it)
            set_base_model(self.trainer.unwrapped(), self.base_model)
        self.head = score_head(self.trainer.unwrapped())
        self.max_length = max_length
        self.stats = reward_stats(self.trainer.unwrapped().config) if normalize and loss is None else None
        checkpointing = training.gradient_checkpointing and loss is not None
        if shared_prefix and checkpointing:
            raise ValueError("RewardModelWorker: shared_prefix=True needs a KV cache, which gradient_checkpointing=True "
                             "turns off in training; set one of them to False")
        self.shared_prefix = shared_prefix if shared_prefix is not None else not (
            checkpointing or isinstance(self.trainer.strategy, FSDP))

    @classmethod
    def resolve_plan(cls, arguments: Mapping[str, Any]) -> RewardModelPlan:
        """The plan of a worker built with `arguments` (the signature's defaults fill the rest)."""
        return plan_reward_model(**with_defaults(cls, arguments))

    @classmethod
    def describe_placement(cls, arguments: dict, world_size: int, on_gpu: bool) -> str:
        """The plan's line for this group: strategy, world size, parameter bytes per rank."""
        plan = cls.resolve_plan(arguments)
        model = {"reward model": lambda: reward_model_source(plan.model_path, plan.dtype, new_head=plan.trained)}
        return describe_placement(plan.training.strategy, on_gpu, world_size, model)

    @classmethod
    def predict_memory(cls, arguments: dict, workload: Workload, placement: Placement) -> MemoryEstimate:
        """Peak memory of one rank (rlhf.workers.memory). Frozen: the model in the compute dtype and one scoring
        forward of `micro_batch_size` conversations of prompt + response tokens (the template adds a few; at
        most `max_length`). Trained: as the critic, fp32 weights, gradients and AdamW state, a scoring forward
        and the update's micro-batches (a score per sequence: no vocabulary-wide logits)."""
        plan = cls.resolve_plan(arguments)
        shape, compute, training = model_shape(plan.model_path), plan.training.compute_dtype, plan.training
        width = min(plan.max_length, workload.tokens + 32)
        if not plan.trained:
            device = frozen_model_terms(shape, "score", compute, placement, "reward model")
            rows = min(training.micro_batch_size, max(1, workload.rows))
            hidden = Term("final hidden states", rows * width * shape.hidden * dtype_bytes(compute))
            forward = forward_terms(shape, rows, width, compute, placement) + [hidden]
            start = fsdp_forward_start_terms(shape, "score", compute, placement)  # its first forward gathers the root
            return estimate("reward_model", [("score (no grad)", device + largest(forward, start))],
                            placement=placement)
        device, host = trained_model_terms(shape, "score", placement, label="reward model")
        rows, width = micro_batch(workload.rows, width, training.micro_batch_size,
                                  training.max_tokens_per_forward or training.max_tokens_per_micro_batch)
        hidden = Term("final hidden states", rows * width * shape.hidden * dtype_bytes(compute))
        root = fsdp_root_terms(shape, "score", compute, placement, "reward model")
        forward = forward_terms(shape, rows, width, compute, placement) + [hidden]
        phases = [("scores (no grad)", between_updates(device) + root
                   + largest(forward, fsdp_forward_start_terms(shape, "score", compute, placement)))]
        mini = max(1, workload.rows // max(1, workload.mini_batches))
        rows, width = micro_batch(mini, width, training.micro_batch_size, training.max_tokens_per_micro_batch)
        backward = training_activation_terms(shape, rows, width, compute, training.gradient_checkpointing, placement)
        phases.append(("update", update_terms(
            shape, "score", compute, placement, device, backward, math.ceil(mini / rows), "reward model",
            recomputed=backward if training.gradient_checkpointing else None)))
        return estimate("reward_model", phases, host, placement)

    @classmethod
    def preflight(cls, arguments: dict) -> None:
        """Before any stage runs: the model (and tokenizer) paths must resolve; a trained one keeps fp32 masters."""
        plan = cls.resolve_plan(arguments)
        for path in (plan.model_path, plan.tokenizer_path):
            if isinstance(path, str):
                resolve_model_path(path)

    # ------------------------------------------------------------- scoring
    def _scores(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                model: torch.nn.Module | None = None, response_length: int = 0) -> torch.Tensor:
        """(B,) scores of rows on the device, under the compute dtype's autocast; `response_length` > 0: rows in
        the prompt | response layout, whose shared prompts are encoded once where `shared_prefix` is on."""
        model = model if model is not None else self.trainer.model
        r = response_length if self.shared_prefix else 0
        with self.trainer.autocast():
            return last_token_scores(model, self.head, input_ids, attention_mask, position_ids, r,
                                     prefix_model=self.trainer.unwrapped())

    @shard
    @torch.no_grad()
    def score(self, batch: Batch) -> Batch:
        """`rm_scores` (B,): the reward model's score of each (raw_prompt, response_text) row, normalised by the
        stored reward mean and std where the folder has them (and `normalize`)."""
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
        scores = self.score_ids(ids)
        if self.stats is not None:
            mean, std = self.stats
            scores = (scores - mean) / std
        return Batch({"rm_scores": scores})

    def score_ids(self, ids: Sequence[Sequence[int]]) -> torch.Tensor:
        """(B,) float32 raw scores of already tokenised conversations, in micro-batches."""
        self.trainer.model.eval()
        size, device = self.trainer.setup.micro_batch_size, self.trainer.device
        parts = []
        for start in range(0, len(ids), size):
            input_ids, mask = left_pad(ids[start : start + size], self.tokenizer.pad_token_id)
            parts.append(self._scores(input_ids.to(device), mask.to(device), position_ids(mask).to(device)).cpu())
        return torch.cat(parts) if parts else torch.zeros(0)

    @shard
    @torch.no_grad()
    def compute_scores(self, batch: Batch) -> Batch:
        """`rm_scores` (B,): raw scores of tokenised rows (a `PreferenceDataset` batch: prompt | response), in
        micro-batches by the forward token budget; what training optimises and held-out metrics read."""
        self.trainer.model.eval()
        model = self.trainer.unwrapped()  # no grad: no DDP hooks to serve
        split = self.trainer.micro_batches(batch, self.trainer.max_tokens_per_forward)
        parts = []
        for micro in split.parts:
            micro = micro.to(self.trainer.device)
            parts.append(self._scores(micro["input_ids"], micro["attention_mask"], micro["position_ids"],
                                      model, micro["responses"].shape[1])[:, None].cpu())
        return Batch({"rm_scores": restore_order(parts, split.order, 1)[:, 0]})

    # -------------------------------------------------------------- update
    @shard_exact
    def update(self, batch: Batch) -> dict[str, float]:
        """One optimizer step (per mini-batch) of the pairwise loss on this rank's pairs.

        Metrics (means over this rank's pairs, scored before each step): `rm/loss` (the Bradley-Terry term),
        `rm/train/accuracy` (chosen scored above rejected), `rm/train/margin` (mean chosen - rejected),
        `rm/train/chosen_mean`, `rm/train/rejected_mean`, and the trainer's `rm/grad_norm`, `rm/lr`."""
        if self.loss is None:
            raise RuntimeError("this reward-model worker was built without a loss (inference only)")
        pair_ranks(batch, "RewardModelWorker.update")
        start = time.perf_counter()

        def micro_loss(micro: Batch, num_tokens: float, num_seqs: float):
            scores = self._scores(micro["input_ids"], micro["attention_mask"], micro["position_ids"],
                                  response_length=micro["responses"].shape[1])
            chosen, rejected = split_pairs(scores)
            margin = split_pairs(micro["margin"])[0] if "margin" in micro else None
            loss, metrics = self.loss(chosen, rejected, margin, num_pairs=num_seqs / 2)
            # means over the micro-batch's pairs, weighted by its pairs (a pair counts once however long)
            return loss, {("rm/loss" if k == "loss" else f"rm/train/{k}"): (v, len(chosen)) for k, v in metrics.items()}

        out = self.trainer.update(batch, micro_loss, whole_units=True)
        out["timing_s/update_rm_worker"] = time.perf_counter() - start
        return out

    # ------------------------------------------------------------ state I/O
    @on_all_ranks
    def set_reward_stats(self, mean: float, std: float) -> None:
        """Store the reward mean and std over the training data in the model's config (saved with it)."""
        config = self.trainer.unwrapped().config
        config.reward_mean, config.reward_std = float(mean), float(std)

    @on_all_ranks
    def save(self, path: str) -> str:
        """A Hugging Face folder (weights, score head, tokenizer; the reward stats in config.json), atomically.
        Trained through an adapter: the merged model (what RL loads) and `<path>-adapter` (the adapter and the
        whole score head, its config naming the base model)."""
        if self.adapter is None:
            return self.trainer.save_pretrained(path, self.tokenizer)
        return save_merged_and_adapter(self.trainer, self.adapter, self.base_model, self.tokenizer, path,
                                       auto_class=AutoModelForSequenceClassification)

