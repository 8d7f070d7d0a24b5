"""The policy worker: actor, rollout engine, reference policy and teacher colocated in one process.

This is the hybrid engine: the rollout engine generates with the actor's own weights, and the
frozen reference policy sits beside it for KL terms; a frozen teacher, when given, sits beside it
too, stored and sharded like the reference, and scores the sampled tokens for on-policy
distillation (docs/distillation.md). With a LoRA adapter on the actor and the
reference being the actor's own base model, there is no second model: the reference is the
actor with its adapter disabled (as TRL and verl do), which costs no memory. One instance runs
per data-parallel rank; `ModelTrainer` (Accelerate) wraps the actor for gradient synchronisation
across ranks.

The worker generates, computes log-probs, updates and saves. What it holds is decided once by its
plan (`rlhf.workers.policy_plan`), which its memory model reads too (`rlhf.workers.policy_memory`);
the engine's wake, sleep and weight sync live in `rlhf.workers.policy_engine` (the transformers
engine shares the actor's module, so its sync is free; any other holds its own copy, which gets the
actor's weights streamed in before the first rollout after an update: docs/rollout_engines.md), and
an adapter's merged-and-alone save in `rlhf.workers.adapter_save`."""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch

from rlhf.algos import log_probs_and_entropy, sum_pi_squared_from_logits, top_k_overlap
from rlhf.batch import Batch
from rlhf.models.lm_head import fusable_lm_head
from rlhf.models.loading import causal_lm_source, load_tokenizer, model_reference, resolve_model_path
from rlhf.models.saving import make_portable, save_tokenizer
from rlhf.models.vocabulary import check_same_vocabulary
from rlhf.ranges import PositiveInt
from rlhf.rollout.engine import EngineFactory, for_policy, named_weights
from rlhf.rollout.hf_engine import HFEngine
from rlhf.rollout.sampling import SamplingParams
from rlhf.signatures import with_defaults
from rlhf.workers.adapter_save import save_merged_and_adapter
from rlhf.workers.dispatch import on_all_ranks, shard, shard_exact
from rlhf.workers.fsdp import describe_placement, local_parameter_bytes, strategy_name
from rlhf.workers.lora import merged, save_adapter_config, set_base_model
from rlhf.workers.memory import MemoryEstimate, Placement, Workload
from rlhf.workers.policy_engine import HybridEngine
from rlhf.workers.policy_memory import predict_policy_memory
from rlhf.workers.policy_plan import SHARED_REFERENCE, PolicyPlan, plan_policy
from rlhf.workers.precision import DType, check_trainable_precision
from rlhf.workers.response_log_probs import (
    response_log_probs, response_log_probs_with_top_k, response_outputs, teacher_scores,
)
from rlhf.workers.rollout_gap import RolloutGap
from rlhf.workers.trained_model import TrainsOneModel
from rlhf.workers.training import OptimizerFactory, SchedulerFactory, TrainingSetup, place_model
from rlhf.workers.weight_sync import NamedTensors, PublishesWeights

# SHARED_REFERENCE and response_log_probs are read from here by callers of the policy worker
__all__ = ["SHARED_REFERENCE", "PolicyWorker", "response_log_probs"]


class PolicyWorker(TrainsOneModel, PublishesWeights):
    """Generates, scores log-probs and trains the policy on one data-parallel rank; publishes its weights
    to a rollout group for asynchronous rollout (`PublishesWeights`, docs/async.md)."""

    def __init__(
        self,
        model_path: str,
        objective: Callable | None = None,  # PolicyObjective / SFTObjective; None: inference only
        optimizer: OptimizerFactory = torch.optim.AdamW,  # called with the parameters
        lr_scheduler: SchedulerFactory | None = None,  # called with the optimizer; stepped per optimizer step
        # frozen reference policy for KL; None: no reference. With an `adapter`, the same model as
        # model_path is not loaded again: the reference is the actor with its adapter disabled
        ref_model_path: str | None = None,
        # the rollout engine (rlhf.rollout.engine): HFEngine shares the actor's module; others
        # (VLLMEngine) are built from model_path and get the actor's weights after each update
        engine: EngineFactory = HFEngine,
        training: TrainingSetup = TrainingSetup(),  # placement, compute dtype, batching, clipping, seed (shared)
        dtype: DType = "float32",  # storage of the policy's weights: float32 when trained (master weights)
        logits_block_elements: PositiveInt | None = None,  # float32 elements per log-prob block; None: 2**24 CPU, 2**28 GPU
        # LM head applied inside the log-prob function, which recomputes the logits in backward on GPUs (memory
        # first) and keeps them once on CPUs (compute first); None: on wherever the head is a plain Linear
        fused_lm_head: bool | None = None,
        adapter: Callable[[torch.nn.Module], torch.nn.Module] | None = None,  # e.g. LoRA(rank=8): train only an adapter
        shared_prefix: bool | None = None,  # encode a group's shared prompt once; None: on except under FSDP
        # frozen teacher for on-policy distillation (any causal LM folder with this model's tokenizer): it scores
        # the sampled tokens at the sampling temperature, stored in the compute dtype and sharded like the
        # reference (docs/distillation.md); None: no teacher
        teacher_model_path: str | None = None,
    ):
        if isinstance(teacher_model_path, str):  # before any model loads: ids must mean the same tokens
            check_same_vocabulary(model_path, teacher_model_path)
        self.plan = plan_policy(
            model_path=model_path, objective=objective, ref_model_path=ref_model_path, engine=engine,
            training=training, dtype=dtype, logits_block_elements=logits_block_elements,
            fused_lm_head=fused_lm_head, adapter=adapter, shared_prefix=shared_prefix,
            on_gpu=torch.cuda.is_available(),  # the device make_accelerator gives this process
            teacher_model_path=teacher_model_path,
        )
        compute_dtype = training.compute_dtype
        self.objective = objective
        self.adapter = adapter
        self.tokenizer = load_tokenizer(model_path)
        source = causal_lm_source(model_path, dtype)
        self.trainer = training.trainer(
            source.wrapped(adapter) if adapter is not None else source,
            optimizer if objective is not None else None,
            lr_scheduler,
            prefix="actor",
        )
        self.base_model = model_reference(model_path)  # what a saved adapter names as its base
        if adapter is not None:  # (FSDP builds the module without a path, so PEFT could not know it)
            set_base_model(self.trainer.unwrapped(), self.base_model)
        self.ref_model = None
        self.reference_released = False  # release_reference() let the frozen reference go
        self.ref_is_base = self.plan.reference_is_base
        if self.plan.reference_model:
            ref = causal_lm_source(ref_model_path, compute_dtype)  # frozen: stored in the compute dtype
            self.ref_model = place_model(ref, self.trainer.strategy, self.trainer.device, compute_dtype,
                                         compile=self.trainer.setup.compile)
            self.ref_model.eval().requires_grad_(False)
        self.teacher_model = None
        if self.plan.teacher_model:  # a sibling of the reference: frozen, in the compute dtype, sharded alike
            teacher = causal_lm_source(teacher_model_path, compute_dtype)
            self.teacher_model = place_model(teacher, self.trainer.strategy, self.trainer.device, compute_dtype,
                                             compile=self.trainer.setup.compile)
            self.teacher_model.eval().requires_grad_(False)
        self.engine = for_policy(self.plan.engine, model_path, self.trainer.unwrapped(), self.tokenizer,
                                 dtype=compute_dtype, device=self.trainer.device)
        self.hybrid = HybridEngine(self.engine, self._rollout_weights, sleeps=objective is not None,
                                   rank=self.trainer.rank)
        self.shared_prefix = self.plan.shared_prefix
        self.logits_block_elements = logits_block_elements
        head_fusable = fusable_lm_head(self.trainer.unwrapped()) is not None
        if self.plan.fused_lm_head_required and not head_fusable:
            raise ValueError("PolicyWorker(fused_lm_head=True) needs a plain bias-free Linear LM head without hooks; "
                             f"{type(self.trainer.unwrapped()).__name__} has another. Set fused_lm_head=None or False.")
        self.fused_lm_head = head_fusable and self.plan.fused_lm_head
        self.keep_logits = self.plan.keep_logits
        self._log_placement()

    @classmethod
    def resolve_plan(cls, arguments: Mapping[str, Any], on_gpu: bool) -> PolicyPlan:
        """The plan of a worker built with `arguments` (the signature's defaults fill the rest) on a device
        with or without a GPU: what `__init__`, `predict_memory` and `describe_placement` all read."""
        return plan_policy(**with_defaults(cls, arguments), on_gpu=on_gpu)

    @classmethod
    def describe_placement(cls, arguments: dict, world_size: int, on_gpu: bool) -> str:
        """The plan's line for this group: strategy, world size, parameter bytes per rank."""
        plan = cls.resolve_plan(arguments, on_gpu)
        models = {"actor": lambda: causal_lm_source(plan.model_path, plan.dtype)}
        if plan.reference_model:
            models["reference"] = lambda: causal_lm_source(plan.ref_model_path, plan.compute_dtype)
        if plan.teacher_model:
            models["teacher"] = lambda: causal_lm_source(plan.teacher_model_path, plan.compute_dtype)
        if plan.engine_copy:
            models["rollout engine"] = lambda: causal_lm_source(plan.model_path, plan.engine.dtype)
        line = describe_placement(plan.training.strategy, on_gpu, world_size, models, whole=["rollout engine"])
        return line + (f", {SHARED_REFERENCE}" if plan.reference_is_base else "")

    def _log_placement(self) -> None:
        """Each rank says what it holds (under FSDP: its shards)."""
        held = ", ".join(f"{k} {b / 2**20:.3f} MB" for k, b in self.parameter_bytes().items())
        if self.ref_is_base:
            held += f", {SHARED_REFERENCE}"
        print(f"[policy rank {self.trainer.rank}/{self.trainer.world_size}] strategy "
              f"{strategy_name(self.trainer.strategy)}: parameters on this rank: {held}; rollout engine "
              f"{type(self.engine).__name__} "
              f"({'sharing the actor' if self.hybrid.shares_weights else 'own weights'})",
              flush=True)

    @classmethod
    def predict_memory(cls, arguments: dict, workload: Workload, placement: Placement) -> MemoryEstimate:
        """Peak memory of one rank per phase of a step, from the model config and these settings alone
        (rlhf.workers.policy_memory). `arguments`: this class's arguments with `training` and `engine` built;
        `model_path`/`ref_model_path` may be `ModelShape`s instead of paths (tests, `rlhf plan --memory`)."""
        return predict_policy_memory(cls.resolve_plan(arguments, placement.device == "cuda"), workload, placement)

    @classmethod
    def preflight(cls, arguments: dict) -> None:
        """Before any stage runs (see rlhf.runtime.preflight_hooks): every model path given as a string must
        resolve, a trained policy must keep fp32 master weights, and a teacher's tokenizer must be the policy's
        (`rlhf.models.vocabulary`: the first differing tokens are named). `training` is a TrainingSetup or
        its unbuilt node: both answer attribute reads, with the signature's defaults."""
        a = with_defaults(cls, arguments)
        if a["objective"] is not None:
            check_trainable_precision("PolicyWorker", a["dtype"], a["training"].compute_dtype)
        for path in (a["model_path"], a["ref_model_path"], a["teacher_model_path"]):
            if isinstance(path, str):
                resolve_model_path(path)
        if isinstance(a["model_path"], str) and isinstance(a["teacher_model_path"], str):
            check_same_vocabulary(a["model_path"], a["teacher_model_path"])

    # ------------------------------------------------------------- rollout
    @shard
    def generate(self, prompts: Batch, sampling: SamplingParams, keep_awake: bool = False) -> Batch:
        """Responses for this rank's prompts (n per prompt), with the engine's log-probs.

        The engine first gets the actor's current weights if they changed; a worker that trains
        puts it to sleep afterwards (its KV cache and weights leave the device for the update).
        `keep_awake`: leave it awake for another call on the same weights (the next turn of a
        multi-turn rollout); the caller ends with `sleep_engine`.
        """
        self.hybrid.wake()
        # only a shared module runs under our autocast
        with self.trainer.autocast() if self.hybrid.shares_weights else contextlib.nullcontext():
            out = self.engine.generate(prompts.to(self.trainer.device), sampling).to("cpu")
        if not keep_awake:
            self.hybrid.sleep()
        return out

    @on_all_ranks
    def sleep_engine(self) -> None:
        """Free the engine's memory for training (a worker that trains; an inference-only one keeps it)."""
        self.hybrid.sleep()

    def _rollout_weights(self, plain: bool = True) -> NamedTensors:
        """The actor's full weights by Hugging Face name, streamed (a collective under FSDP); `plain`:
        an adapter merged in (W + alpha/r B A), as an engine with its own copy holds them."""
        actor = self.trainer.unwrapped()
        return named_weights(merged(actor) if plain and self.adapter is not None else actor)

    def _is_main_rank(self) -> bool:
        return self.trainer.accelerator.is_main_process

    def _weights_device(self) -> torch.device:
        return self.trainer.device

    # ----------------------------------------------------------- log-probs
    @torch.no_grad()
    def _log_probs_batched(self, model: torch.nn.Module, batch: Batch, key: str) -> Batch:
        temperature = batch.require_meta("temperature", f"PolicyWorker ({key})")
        base = self.trainer.unwrapped() if model is self.trainer.model else model  # no grad: no DDP hooks to serve
        fused = self.fused_lm_head and fusable_lm_head(base) is not None

        def forward(micro: Batch) -> torch.Tensor:
            with self.trainer.autocast():
                return response_log_probs(base, micro, temperature, shared_prefix=self.shared_prefix,
                                          block_elements=self.logits_block_elements, fused_lm_head=fused)[0]

        return Batch({key: self.trainer.map_micro_batches(batch, forward)})

    @shard
    def compute_log_probs(self, batch: Batch) -> Batch:
        """`old_log_probs` (B,T): the current policy's log-probs, before this step's update."""
        self.trainer.model.eval()
        return self._log_probs_batched(self.trainer.model, batch, "old_log_probs")

    @shard
    def compute_token_stats(self, batch: Batch) -> Batch:
        """`old_log_probs` and `sum_pi_squared` (B,T), sum_v pi_old(v)^2 at the sampling temperature: the
        optimal token baseline's inputs, from one forward pass here where the logits are (the driver
        never sees a (B,T,V) tensor)."""
        self.trainer.model.eval()
        temperature = batch.require_meta("temperature", "PolicyWorker.compute_token_stats")

        @torch.no_grad()
        def forward(micro: Batch) -> torch.Tensor:
            with self.trainer.autocast():
                logits = response_outputs(self.trainer.model, micro, self.shared_prefix, None)
                log_probs = log_probs_and_entropy(logits, micro["responses"], temperature=temperature,
                                                  max_block_elements=self.logits_block_elements)[0]
                sum_pi2 = sum_pi_squared_from_logits(logits, temperature=temperature,
                                                     max_block_elements=self.logits_block_elements)
            return torch.stack([log_probs, sum_pi2], dim=-1)

        stats = self.trainer.map_micro_batches(batch, forward)
        return Batch({"old_log_probs": stats[..., 0], "sum_pi_squared": stats[..., 1]})

    @shard
    def compute_ref_log_probs(self, batch: Batch) -> Batch:
        """`ref_log_probs` (B,T) under the frozen reference policy."""
        return self._ref_log_probs(batch)

    def _ref_log_probs(self, batch: Batch) -> Batch:
        if self.ref_is_base:  # the actor's frozen base: the same weights, without the adapter's update
            self.trainer.model.eval()
            with self.trainer.unwrapped().disable_adapter():
                return self._log_probs_batched(self.trainer.model, batch, "ref_log_probs")
        if self.ref_model is None and self.reference_released:
            raise RuntimeError(
                "the reference log-probs were asked for after release_reference() let this worker's reference "
                "model go (a DPO stage does so once it has cached every pair's reference log-probs); compute what "
                "needs the reference before releasing it, or do not release it."
            )
        if self.ref_model is None:
            raise RuntimeError(
                "compute_ref_log_probs was called but this policy worker has no reference model; "
                "set PolicyWorker.ref_model_path (the experiment's KL settings need it)."
            )
        return self._log_probs_batched(self.ref_model, batch, "ref_log_probs")

    @shard
    def compute_teacher_log_probs(self, batch: Batch) -> Batch:
        """`teacher_log_probs` (B,T): the frozen teacher's log-probs of the sampled tokens at the sampling
        temperature (logits / T, then log-softmax, as `old_log_probs`); with a top-k distillation loss in the
        objective also `teacher_top_k_ids` and `teacher_top_k_log_probs` (B,T,K), from the same forward."""
        return self._teacher_log_probs(batch)

    def _teacher_log_probs(self, batch: Batch) -> Batch:
        if self.teacher_model is None:
            raise RuntimeError(
                "the teacher's log-probs were asked for (on-policy distillation), but this policy worker has no "
                "teacher; set PolicyWorker.teacher_model_path (docs/distillation.md)."
            )
        k = self.plan.teacher_top_k
        if not k:
            return self._log_probs_batched(self.teacher_model, batch, "teacher_log_probs")
        temperature = batch.require_meta("temperature", "PolicyWorker (teacher_log_probs)")

        def forward(micro: Batch) -> torch.Tensor:
            with self.trainer.autocast():
                return teacher_scores(self.teacher_model, micro, temperature, k, shared_prefix=self.shared_prefix,
                                      block_elements=self.logits_block_elements)

        scores = self.trainer.map_micro_batches(batch, forward)
        return Batch({"teacher_log_probs": scores[..., 0].float(),
                      "teacher_top_k_log_probs": scores[..., 1:1 + k].float(),
                      "teacher_top_k_ids": scores[..., 1 + k:].round().long()})

    # -------------------------------------------------------------- update
    @shard_exact
    def update(self, batch: Batch) -> dict[str, float]:
        """Train on this rank's shard (see ModelTrainer.update for the normalisation)."""
        if self.objective is None:
            raise RuntimeError("this policy worker was built without an objective (inference only)")
        start = time.perf_counter()
        ref_seconds = 0.0
        has_ref = "ref_log_probs" in batch or "ref_logps" in batch  # per token, or per row (cached by the DPO trainer)
        if getattr(self.objective, "needs_ref", False) and not has_ref:
            batch = batch.union(self._ref_log_probs(batch))  # see requirements
            ref_seconds = time.perf_counter() - start
        top_k = self.plan.teacher_top_k
        if top_k and "teacher_top_k_ids" not in batch:  # like the reference's: this rank's rows, here
            teacher_start = time.perf_counter()
            batch = batch.union(self._teacher_log_probs(batch).select(["teacher_top_k_ids", "teacher_top_k_log_probs"]))
            ref_seconds += time.perf_counter() - teacher_start
        temperature = batch.require_meta("temperature", "PolicyWorker.update")
        entropy_grad = getattr(self.objective, "needs_entropy_grad", False)
        unwrapped = self.trainer.unwrapped()
        fused = self.fused_lm_head and fusable_lm_head(unwrapped) is not None  # a hook added since construction
        inert_rows = self.objective.inert_rows if self.plan.skip_inert_rows else None
        gap = RolloutGap(batch, rows=None if inert_rows is None else ~inert_rows(batch))

        def micro_loss(micro: Batch, num_tokens: float, num_seqs: float):
            extra, own_top_k = {}, None
            if top_k:  # the teacher's top-k tokens under the student need the full logits: not fused
                log_probs, entropy, extra["top_k_log_probs"], own_top_k = response_log_probs_with_top_k(
                    self.trainer.model, micro, temperature, micro["teacher_top_k_ids"],
                    shared_prefix=self.shared_prefix, prefix_model=unwrapped, block_elements=self.logits_block_elements)
            else:
                log_probs, entropy = response_log_probs(self.trainer.model, micro, temperature, with_entropy=True,
                                                        shared_prefix=self.shared_prefix, prefix_model=unwrapped,
                                                        block_elements=self.logits_block_elements,
                                                        fused_lm_head=fused, keep_logits=self.keep_logits)
            entropy_metric = entropy.detach()
            loss, metrics = self.objective(log_probs, entropy if entropy_grad else entropy_metric, micro,
                                           num_tokens=num_tokens, num_seqs=num_seqs, **extra)
            mask = micro["response_mask"]
            if own_top_k is not None:
                metrics["distill/top_k_overlap"] = top_k_overlap(own_top_k, micro["teacher_top_k_ids"], mask)
            metrics["actor/entropy"] = (entropy_metric * mask).sum() / mask.sum().clamp(min=1)
            metrics.update(gap.from_micro_batch(log_probs, micro))
            return loss, metrics

        # a loss over preference pairs needs both rows of a pair in one micro-batch
        out = self.trainer.update(batch, micro_loss, whole_units=getattr(self.objective, "whole_units", False),
                                  inert_rows=inert_rows)
        out.update(gap.result(self.trainer))
        self.hybrid.weights_changed()
        out["timing_s/update_worker"] = time.perf_counter() - start
        if ref_seconds:
            out["timing_s/ref_in_update"] = ref_seconds  # the reference's and (top-k) the teacher's forwards
        return out

    @on_all_ranks
    def requirements(self) -> dict[str, bool]:
        """The columns the driver must add before `update`, keyed by their Batch names:
        `old_log_probs`, `ref_log_probs`; and `zero_advantage_rows_left_out`: `update` leaves the rows whose
        advantages are all 0 out (`PolicyObjective.skips_inert_rows`), so their old log-probs may be left 0.

        Old log-probs are skipped when provably on-policy (one epoch, one mini-batch): the
        update then uses the current log-probs, detached, as the old ones. Reference
        log-probs are never asked for: this worker holds the reference model, so `update`
        computes them for its own rows when the batch lacks them (one call per step fewer:
        a Ray round trip with the batch costs ~5 ms on a small machine). A driver that needs
        them itself (a KL penalty in the reward) calls `compute_ref_log_probs`.
        """
        off_policy = self.trainer.setup.epochs > 1 or self.trainer.setup.mini_batches > 1
        # rows whose advantages are all 0 are left out of the update: their old log-probs are never read
        return {"old_log_probs": self.objective is not None and off_policy, "ref_log_probs": False,
                "zero_advantage_rows_left_out": self.plan.skip_inert_rows}

    # ------------------------------------------------------------ state I/O
    @on_all_ranks
    def save(self, path: str) -> str:
        """Write a Hugging Face model folder (weights + tokenizer) atomically; returns the path.

        With an adapter, the folder holds the merged model (so RL stages start from it
        unchanged) and `<path>-adapter` holds the adapter alone (with the tokenizer; its config
        names the base model), which `rlhf serve`, `generate` and `export` also take.
        """
        if self.adapter is None:
            return self.trainer.save_pretrained(path, self.tokenizer)
        return save_merged_and_adapter(self.trainer, self.adapter, self.base_model, self.tokenizer, path)

    @on_all_ranks
    def save_state(self, path: str) -> None:
        """Everything needed to resume exactly (trained weights, optimizer, LR schedule, RNG states),
        plus the model config and tokenizer in `hf/`, so `rlhf export` can rebuild the model; with an
        adapter, only the adapter's weights are saved (the base comes from the model path) and `hf/`
        holds `adapter_config.json` too, naming the base model."""
        super().save_state(path)
        if self.trainer.accelerator.is_main_process:
            model = self.trainer.unwrapped()
            model.config.save_pretrained(f"{path}/hf")
            model.generation_config.save_pretrained(f"{path}/hf")
            save_tokenizer(self.tokenizer, f"{path}/hf")
            if self.adapter is not None:
                save_adapter_config(model, f"{path}/hf")
            make_portable(f"{path}/hf")
        self.trainer.accelerator.wait_for_everyone()

    @on_all_ranks
    def load_state(self, path: str) -> None:
        super().load_state(path)
        self.hybrid.weights_changed()

    @on_all_ranks
    def parameter_bytes(self) -> dict[str, int]:
        """Bytes of parameters this rank holds, per model (under FSDP: its shards); a reference that is
        the actor's base with the adapter disabled holds none of its own."""
        models = {"actor": self.trainer.model} | ({"reference": self.ref_model} if self.ref_model is not None else {})
        if self.teacher_model is not None:
            models["teacher"] = self.teacher_model
        held = {name: local_parameter_bytes(model) for name, model in models.items()}
        return held | ({"reference": 0} if self.ref_is_base else {})

    @on_all_ranks
    def release_reference(self) -> int:
        """Let the frozen reference model go, for a caller that needs it no more (the DPO stage, once every
        pair's reference log-probs are cached): its memory goes back for training, as TRL's DPO with
        precomputed reference log-probs holds no reference model. Returns the bytes of parameters freed on this
        rank (0 where it held no copy of its own: no reference, or the actor's base with its adapter disabled)."""
        if self.ref_model is None:
            return 0
        freed = local_parameter_bytes(self.ref_model)
        self.ref_model, self.reference_released = None, True
        gc.collect()  # the module's parameters are freed now, not at the next collection of a reference cycle
        return freed

