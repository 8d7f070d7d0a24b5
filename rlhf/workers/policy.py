"""The policy worker: actor, rollout engine and reference policy colocated in one process.

This is the hybrid engine: the rollout engine generates with the actor's own weights, and the
frozen reference policy sits beside it for KL terms. The transformers engine shares the actor's
module (the weight sync is free); any other engine (vLLM) holds its own copy, which gets the
actor's weights streamed in before the first rollout after an update, and sleeps while the
trainer runs (docs/rollout_engines.md). One instance runs per data-parallel rank;
`ModelTrainer` (Accelerate) wraps the actor for gradient synchronisation across ranks.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

import torch
from transformers import AutoModelForCausalLM

from rlhf.algos import linear_log_probs_and_entropy, log_probs_and_entropy, sum_pi_squared_from_logits
from rlhf.batch import Batch
from rlhf.ranges import PositiveInt
from rlhf.models.lm_head import fusable_lm_head, lm_head_bypassed
from rlhf.models.loading import causal_lm_source, load_tokenizer, resolve_model_path
from rlhf.models.shared_prefix import response_logits
from rlhf.rollout.engine import EngineFactory, for_policy, named_weights
from rlhf.rollout.hf_engine import HFEngine
from rlhf.rollout.sampling import SamplingParams
from rlhf.workers.fsdp import (
    FSDP, describe_placement, full_tensor, is_sharded, local_parameter_bytes, strategy_name,
)
from rlhf.workers.precision import DType, check_trainable_precision
from rlhf.workers.dispatch import on_all_ranks, shard, shard_exact
from rlhf.io.atomic import atomic_write_dir
from rlhf.workers.lora import merged, save_adapter
from rlhf.workers.state_io import unsharded_copy
from rlhf.workers.training import ModelTrainer, OptimizerFactory, SchedulerFactory, TrainingSetup, place_model


def response_log_probs(
    model: torch.nn.Module,
    batch: Batch,
    temperature: float,
    with_entropy: bool = False,
    shared_prefix: bool = False,
    prefix_model: torch.nn.Module | None = None,
    block_elements: int | None = None,
    fused_lm_head: bool = False,
    keep_logits: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probs (B,T) of `responses` under `model`, and entropy (B,T) or None, in float32.

    Logits are computed only for response positions (`logits_to_keep`) and stay in the
    model's compute dtype: the temperature and the float32 cast happen block by block inside
    `log_probs_and_entropy`, never on the whole (B,T,V) tensor. The entropy is differentiable;
    detach it for a metric. `shared_prefix`: encode each distinct prompt once for all its rows
    (rlhf.models.shared_prefix; equal up to float rounding, and much cheaper when the n samples
    of a group share a long prompt); `prefix_model` is the unwrapped module under DDP;
    `block_elements`: the float32 temporaries' budget (rlhf.algos.logprobs; None: per device);
    `fused_lm_head`: apply the LM head inside the log-prob function (`linear_log_probs_and_entropy`):
    the (B,T,V) logits and their gradient never exist side by side; needs a plain Linear head
    (`fusable_lm_head`). `keep_logits` (with `fused_lm_head`): keep the logits for backward, which
    turns them into their gradient in place, instead of recomputing them block by block.
    """
    unwrapped = prefix_model or model
    with lm_head_bypassed(unwrapped) if fused_lm_head else contextlib.nullcontext() as head:
        outputs = _response_outputs(model, batch, shared_prefix, prefix_model)  # hidden states when bypassed
    responses = batch["responses"]
    if head is not None:
        return linear_log_probs_and_entropy(outputs, head.weight, responses, temperature=temperature,
                                            with_entropy=with_entropy, max_block_elements=block_elements,
                                            keep_logits=keep_logits)
    return log_probs_and_entropy(outputs, responses, temperature=temperature, with_entropy=with_entropy,
                                 max_block_elements=block_elements)


def _response_outputs(model, batch: Batch, shared_prefix: bool, prefix_model) -> torch.Tensor:
    """(B, R, ...) outputs of the model at the positions predicting each response token."""
    r = batch["responses"].shape[1]
    if shared_prefix:
        return response_logits(model, batch["input_ids"], batch["attention_mask"], batch["position_ids"], r,
                               prefix_model=prefix_model)
    return model(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        position_ids=batch["position_ids"],
        logits_to_keep=r + 1,
        use_cache=False,
    ).logits[:, :-1, :]


class RolloutGap:
    """The trainer-vs-engine log-prob gap of one update: mean and max |log pi_old - log pi_rollout|
    over response tokens (`rollout_corr/log_prob_abs_diff`, `..._max`), logged every step.

    Where it is free and right: with `old_log_probs` in the batch (off-policy updates) straight
    from them; otherwise the update is provably on-policy (one epoch, one mini-batch: no
    optimizer step before the last micro-batch), so each micro-batch's own log-probs are the
    old ones, and the gap costs no extra forward. A stale engine (a missed weight sync) shows
    here first: the gap jumps from rounding noise (~1e-6 fp32, ~1e-2 bf16) to O(1).
    """

    def __init__(self, batch: Batch):
        self.active = "rollout_log_probs" in batch
        self.from_old = self.active and "old_log_probs" in batch
        self.max = torch.zeros(())
        self.mean: float | None = None
        if self.from_old:
            mask = batch["response_mask"].bool()
            diff = (batch["old_log_probs"] - batch["rollout_log_probs"]).abs()[mask]
            self.mean = float(diff.mean()) if diff.numel() else 0.0
            self.max = diff.max() if diff.numel() else torch.zeros(())

    def from_micro_batch(self, log_probs: torch.Tensor, micro: Batch) -> dict[str, torch.Tensor]:
        """The micro-batch's token-mean gap (the trainer averages it over tokens); tracks the max."""
        if not self.active or self.from_old:
            return {}
        mask = micro["response_mask"].bool()
        diff = (log_probs.detach() - micro["rollout_log_probs"]).abs().masked_fill(~mask, 0.0)
        if diff.numel() == 0:
            return {}
        self.max = torch.maximum(self.max.to(diff.device), diff.max())
        return {"rollout_corr/log_prob_abs_diff": diff.sum() / mask.sum().clamp(min=1)}

    def result(self, trainer: ModelTrainer) -> dict[str, float]:
        """The max over every rank (one collective); the mean when it came from old_log_probs."""
        if not self.active:
            return {}
        peak = self.max.to(trainer.device, torch.float32).reshape(1)
        if trainer.world_size > 1:
            torch.distributed.all_reduce(peak, op=torch.distributed.ReduceOp.MAX)
        out = {"rollout_corr/log_prob_abs_diff_max": float(peak)}
        if self.mean is not None:
            out["rollout_corr/log_prob_abs_diff"] = self.mean
        return out


class PolicyWorker:
    """Generates, scores log-probs and trains the policy on one data-parallel rank."""

    def __init__(
        self,
        model_path: str,
        objective: Callable | None = None,  # PolicyObjective / SFTObjective; None: inference only
        optimizer: OptimizerFactory = torch.optim.AdamW,  # called with the parameters
        lr_scheduler: SchedulerFactory | None = None,  # called with the optimizer; stepped per optimizer step
        ref_model_path: str | None = None,  # frozen reference policy for KL; None: no reference
        # the rollout engine (rlhf.rollout.engine): HFEngine shares the actor's module; others
        # (VLLMEngine) are built from model_path and get the actor's weights after each update
        engine: EngineFactory = HFEngine,
        training: TrainingSetup = TrainingSetup(),  # placement, compute dtype, batching, clipping, seed (shared)
        dtype: DType = "float32",  # storage of the policy's weights: float32 when trained (master weights)
        logits_block_elements: PositiveInt | None = None,  # float32 elements per log-prob block; None: 2**24 CPU, 2**28 GPU
        # LM head applied inside the log-prob function, which recomputes the logits in backward on GPUs (memory
        # first) and keeps them once on CPUs (compute first); None: on wherever the head is a plain Linear
        fused_lm_head: bool | None = None,
        adapter: Callable[[torch.nn.Module], torch.nn.Module] | None = None,  # e.g. LoRA(r=8): train only an adapter
        shared_prefix: bool | None = None,  # encode a group's shared prompt once; None: on except under FSDP
    ):
        compute_dtype = training.compute_dtype
        if objective is not None:
            check_trainable_precision("PolicyWorker", dtype, compute_dtype)
        if getattr(objective, "needs_ref", False) and ref_model_path is None:
            raise ValueError(
                "the policy objective has a KL loss against a reference policy, but PolicyWorker.ref_model_path "
                "is None. Set ref_model_path (usually the initial model path) or remove the KL loss."
            )
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
        self.ref_model = None
        if ref_model_path is not None:
            ref = causal_lm_source(ref_model_path, compute_dtype)  # frozen: stored in the compute dtype
            self.ref_model = place_model(ref, self.trainer.strategy, self.trainer.device, compute_dtype)
            self.ref_model.eval().requires_grad_(False)
        self.engine = for_policy(engine, model_path, self.trainer.unwrapped(), self.tokenizer,
                                 dtype=compute_dtype, device=self.trainer.device)
        self._engine_stale = False  # the engine's weights may differ from the actor's (update, resume, sleep)
        # Under FSDP the two passes of a shared-prefix forward have not been run on GPUs yet;
        # gradient checkpointing turns off the KV cache the shared-prefix forward needs.
        fsdp = isinstance(self.trainer.strategy, FSDP)
        if shared_prefix is None:
            shared_prefix = not fsdp and not training.gradient_checkpointing
        elif shared_prefix and training.gradient_checkpointing:
            raise ValueError("PolicyWorker: shared_prefix=True needs a KV cache, which gradient_checkpointing=True "
                             "turns off in training; set one of them to False")
        self.shared_prefix = shared_prefix
        self.logits_block_elements = logits_block_elements
        head_fusable = fusable_lm_head(self.trainer.unwrapped()) is not None
        if fused_lm_head and not head_fusable:
            raise ValueError("PolicyWorker(fused_lm_head=True) needs a plain bias-free Linear LM head without hooks; "
                             f"{type(self.trainer.unwrapped()).__name__} has another. Set fused_lm_head=None or False.")
        self.fused_lm_head = head_fusable and (fused_lm_head is None or fused_lm_head)
        # a CPU has memory to spare and compute to save: keep the logits, turned into their gradient in
        # place (one (B,T,V) tensor, where the model's own head allocates two); a GPU recomputes them
        self.keep_logits = self.trainer.device.type != "cuda"
        self._log_placement()

    @staticmethod
    def describe_placement(arguments: dict, world_size: int, on_gpu: bool) -> str:
        """The plan's line for this group: strategy, world size, parameter bytes per rank."""
        training = arguments["training"]
        models = {"actor": lambda: causal_lm_source(arguments["model_path"], arguments["dtype"])}
        if arguments.get("ref_model_path") is not None:
            models["reference"] = lambda: causal_lm_source(arguments["ref_model_path"], training.compute_dtype)
        return describe_placement(training.strategy, on_gpu, world_size, models)

    def _log_placement(self) -> None:
        """Each rank says what it holds (under FSDP: its shards)."""
        held = ", ".join(f"{k} {b / 2**20:.3f} MB" for k, b in self.parameter_bytes().items())
        print(f"[policy rank {self.trainer.rank}/{self.trainer.world_size}] strategy "
              f"{strategy_name(self.trainer.strategy)}: parameters on this rank: {held}", flush=True)

    @staticmethod
    def preflight(arguments: dict) -> None:
        """Before any stage runs (see rlhf.runtime.preflight_hooks): every model path given as a string must
        resolve, and a trained policy must keep fp32 master weights. `training` is a TrainingSetup or
        its unbuilt node: both answer attribute reads, with the signature's defaults."""
        if arguments.get("objective") is not None:
            check_trainable_precision("PolicyWorker", arguments["dtype"], arguments["training"].compute_dtype)
        for key in ("model_path", "ref_model_path"):
            if isinstance(arguments.get(key), str):
                resolve_model_path(arguments[key])

    # ------------------------------------------------------------- rollout
    @shard
    def generate(self, prompts: Batch, sampling: SamplingParams) -> Batch:
        """Responses for this rank's prompts (n per prompt), with the engine's log-probs.

        The engine first gets the actor's current weights if they changed; a worker that trains
        puts it to sleep afterwards (its KV cache and weights leave the device for the update).
        """
        self._wake_engine()
        shares = getattr(self.engine, "shares_weights", False)  # only a shared module runs under our autocast
        with self.trainer.autocast() if shares else contextlib.nullcontext():
            out = self.engine.generate(prompts.to(self.trainer.device), sampling).to("cpu")
        if self.objective is not None:
            self.engine.sleep()
            self._engine_stale = True  # after sleep the engine's weights are undefined (vLLM level 2)
        return out

    def _wake_engine(self) -> None:
        """Weights first, then the KV cache: never old weights, new weights and a KV cache at once."""
        if not self._engine_stale:
            self.engine.wake_up()
            return
        self.engine.wake_up(["weights"])
        actor = self.trainer.unwrapped()
        if self.adapter is not None and not getattr(self.engine, "shares_weights", False):
            actor = merged(actor)  # the engine holds plain weights: W + alpha/r B A
        self.engine.update_weights(named_weights(actor))  # a sharing engine consumes nothing
        self.engine.wake_up(["kv_cache"])
        self._engine_stale = False

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
                logits = _response_outputs(self.trainer.model, micro, self.shared_prefix, None)
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
        if self.ref_model is None:
            raise RuntimeError(
                "compute_ref_log_probs was called but this policy worker has no reference model; "
                "set PolicyWorker.ref_model_path (the experiment's KL settings need it)."
            )
        return self._log_probs_batched(self.ref_model, batch, "ref_log_probs")

    # -------------------------------------------------------------- update
    @shard_exact
    def update(self, batch: Batch) -> dict[str, float]:
        """Train on this rank's shard (see ModelTrainer.update for the normalisation)."""
        if self.objective is None:
            raise RuntimeError("this policy worker was built without an objective (inference only)")
        start = time.perf_counter()
        ref_seconds = 0.0
        if getattr(self.objective, "needs_ref", False) and "ref_log_probs" not in batch:
            batch = batch.union(self._log_probs_batched(self.ref_model, batch, "ref_log_probs"))  # see requirements
            ref_seconds = time.perf_counter() - start
        temperature = batch.require_meta("temperature", "PolicyWorker.update")
        entropy_grad = getattr(self.objective, "needs_entropy_grad", False)
        unwrapped = self.trainer.unwrapped()
        fused = self.fused_lm_head and fusable_lm_head(unwrapped) is not None  # a hook added since construction
        gap = RolloutGap(batch)

        def micro_loss(micro: Batch, num_tokens: float, num_seqs: float):
            log_probs, entropy = response_log_probs(self.trainer.model, micro, temperature, with_entropy=True,
                                                    shared_prefix=self.shared_prefix, prefix_model=unwrapped,
                                                    block_elements=self.logits_block_elements,
                                                    fused_lm_head=fused, keep_logits=self.keep_logits)
            entropy_metric = entropy.detach()
            loss, metrics = self.objective(log_probs, entropy if entropy_grad else entropy_metric, micro,
                                           num_tokens=num_tokens, num_seqs=num_seqs)
            mask = micro["response_mask"]
            metrics["actor/entropy"] = (entropy_metric * mask).sum() / mask.sum().clamp(min=1)
            metrics.update(gap.from_micro_batch(log_probs, micro))
            return loss, metrics

        out = self.trainer.update(batch, micro_loss)
        out.update(gap.result(self.trainer))
        self._engine_stale = True
        out["timing_s/update_worker"] = time.perf_counter() - start
        if ref_seconds:
            out["timing_s/ref_in_update"] = ref_seconds
        return out

    @on_all_ranks
    def requirements(self) -> dict[str, bool]:
        """The columns the driver must add before `update`, keyed by their Batch names:
        `old_log_probs`, `ref_log_probs`.

        Old log-probs are skipped when provably on-policy (one epoch, one mini-batch): the
        update then uses the current log-probs, detached, as the old ones. Reference
        log-probs are never asked for: this worker holds the reference model, so `update`
        computes them for its own rows when the batch lacks them (one call per step fewer:
        a Ray round trip with the batch costs ~5 ms on a small machine). A driver that needs
        them itself (a KL penalty in the reward) calls `compute_ref_log_probs`.
        """
        off_policy = self.trainer.epochs > 1 or self.trainer.mini_batches > 1
        return {"old_log_probs": self.objective is not None and off_policy, "ref_log_probs": False}

    # ------------------------------------------------------------ state I/O
    @on_all_ranks
    def save(self, path: str) -> str:
        """Write a Hugging Face model folder (weights + tokenizer) atomically; returns the path.

        With an adapter, the folder holds the merged model (so RL stages start from it
        unchanged) and `<path>-adapter` holds the adapter alone.
        """
        if self.adapter is None:
            return self.trainer.save_pretrained(path, self.tokenizer)
        model = self.trainer.unwrapped()
        main = self.trainer.accelerator.is_main_process
        if is_sharded(model):  # PEFT saves and merges a plain module: gather a whole copy on rank 0
            self.trainer.accelerator.wait_for_everyone()
            state = self.trainer.full_state_dict()  # every rank takes part; rank 0 gets the weights
            config = model.get_base_model().config
            model = unsharded_copy(model, state, lambda: self.adapter(AutoModelForCausalLM.from_config(config))) \
                if main else None
        if main:
            save_adapter(model, f"{path}-adapter")
            atomic_write_dir(path, lambda tmp: (merged(model).save_pretrained(tmp), self.tokenizer.save_pretrained(tmp)))
        self.trainer.accelerator.wait_for_everyone()
        return path

    @on_all_ranks
    def save_state(self, path: str) -> None:
        """Everything needed to resume exactly (weights, optimizer, LR schedule, RNG states),
        plus the model config and tokenizer in `hf/`, so `rlhf export` can rebuild the model."""
        self.trainer.save_state(path)
        if self.trainer.accelerator.is_main_process:
            model = self.trainer.unwrapped()
            model.config.save_pretrained(f"{path}/hf")
            model.generation_config.save_pretrained(f"{path}/hf")
            self.tokenizer.save_pretrained(f"{path}/hf")
        self.trainer.accelerator.wait_for_everyone()

    @on_all_ranks
    def load_state(self, path: str) -> None:
        self.trainer.load_state(path)
        self._engine_stale = True

    @on_all_ranks
    def parameter_bytes(self) -> dict[str, int]:
        """Bytes of parameters this rank holds, per model (under FSDP: its shards)."""
        models = {"actor": self.trainer.model} | ({"reference": self.ref_model} if self.ref_model is not None else {})
        return {name: local_parameter_bytes(model) for name, model in models.items()}

    @on_all_ranks
    def weights_finite(self) -> bool:
        return self.trainer.parameters_finite()

    @on_all_ranks
    def parameters_digest(self) -> dict[str, torch.Tensor]:
        """A copy of the actor's parameters (tests compare ranks and runtimes with it)."""
        return {k: full_tensor(v).detach().cpu().clone() for k, v in self.trainer.unwrapped().state_dict().items()}
