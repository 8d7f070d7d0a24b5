"""The policy worker: actor, rollout engine and reference policy colocated in one process.

This is the hybrid engine: the rollout engine generates with the actor's own weights (the HF
engine shares the module, so the weight sync after an update is free), and the frozen
reference policy sits beside it for KL terms. One instance runs per data-parallel rank;
Accelerate wraps the actor for gradient synchronisation across ranks.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import torch

from rlhf.algos import entropy_from_logits, log_probs_from_logits
from rlhf.batch import Batch
from rlhf.models.loading import load_causal_lm, load_tokenizer, resolve_model_path
from rlhf.rollout.hf_engine import HFEngine
from rlhf.rollout.sampling import SamplingParams
from rlhf.workers.accelerator import Strategy, make_accelerator
from rlhf.workers.dispatch import on_all_ranks, shard, shard_exact

OptimizerFactory = Callable[..., torch.optim.Optimizer]
SchedulerFactory = Callable[[torch.optim.Optimizer], torch.optim.lr_scheduler.LRScheduler]


class PolicyWorker:
    """Generates, scores log-probs and trains the policy on one data-parallel rank."""

    def __init__(
        self,
        model_path: str,
        objective: Callable | None = None,  # PolicyObjective / SFTObjective; None: inference only
        optimizer: OptimizerFactory = torch.optim.AdamW,  # called with the parameters
        lr_scheduler: SchedulerFactory | None = None,  # called with the optimizer; stepped per update
        ref_model_path: str | None = None,  # frozen reference policy for KL; None: no reference
        engine: Callable[..., object] = HFEngine,  # called as engine(model, tokenizer)
        strategy: Strategy = "auto",  # "auto": FSDP on GPUs, DDP on CPUs
        dtype: str = "float32",
        micro_batch_size: int = 64,  # rows per forward/backward (gradient accumulation below it)
        mini_batches: int = 1,  # optimizer steps per update call per epoch (PPO mini-batches)
        epochs: int = 1,  # passes over the batch per update call (PPO epochs)
        grad_clip: float | None = 1.0,  # max global gradient norm; None: no clipping
        seed: int = 0,
    ):
        if getattr(objective, "needs_ref", False) and ref_model_path is None:
            raise ValueError(
                "the policy objective has a KL loss against a reference policy, but PolicyWorker.ref_model_path "
                "is None. Set ref_model_path (usually the initial model path) or remove the KL loss."
            )
        self.accelerator = make_accelerator(strategy)
        self.rank = self.accelerator.process_index
        self.world_size = self.accelerator.num_processes
        torch.manual_seed(seed + self.rank)
        self.tokenizer = load_tokenizer(model_path)
        model = load_causal_lm(model_path, dtype)
        self.objective = objective
        self.micro_batch_size = micro_batch_size
        self.mini_batches = mini_batches
        self.epochs = epochs
        self.grad_clip = grad_clip
        self.skipped_updates = 0
        if objective is not None:
            opt = optimizer(model.parameters())
            self.model, self.optimizer = self.accelerator.prepare(model, opt)
            self.scheduler = lr_scheduler(self.optimizer) if lr_scheduler is not None else None
        else:  # nothing to synchronise: no DDP/FSDP wrapper
            self.model = model.to(self.accelerator.device)
            self.optimizer = self.scheduler = None
        self.ref_model = None
        if ref_model_path is not None:
            self.ref_model = load_causal_lm(ref_model_path, dtype).to(self.accelerator.device).eval()
            self.ref_model.requires_grad_(False)
        self.engine = engine(self._unwrapped(), self.tokenizer)

    @staticmethod
    def preflight(arguments: dict) -> None:
        """Before any stage runs: every model path given as a string must resolve (see rlhf.config.validate)."""
        for key in ("model_path", "ref_model_path"):
            if isinstance(arguments.get(key), str):
                resolve_model_path(arguments[key])

    def _unwrapped(self) -> torch.nn.Module:
        return self.accelerator.unwrap_model(self.model)

    # ------------------------------------------------------------- rollout
    @shard
    def generate(self, prompts: Batch, sampling: SamplingParams) -> Batch:
        """Responses for this rank's prompts (n per prompt), with the engine's log-probs."""
        start = time.perf_counter()
        out = self.engine.generate(prompts.to(self.accelerator.device), sampling).to("cpu")
        out.meta["timing_s/gen_worker"] = time.perf_counter() - start
        return out

    # ----------------------------------------------------------- log-probs
    def _log_probs(
        self, model: torch.nn.Module, batch: Batch, temperature: float, entropy: str = "none"
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Per-token log-probs (B,R) of `responses` under `model`, and entropy (B,R) or None.

        entropy: "grad" keeps it in the autograd graph (an entropy bonus), "metric" computes it
        detached from the same logits, "none" skips it.
        """
        responses = batch["responses"]
        out = model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            position_ids=batch["position_ids"],
            logits_to_keep=responses.shape[1] + 1,
            use_cache=False,
        )
        logits = out.logits[:, :-1, :].float() / temperature
        log_probs = log_probs_from_logits(logits, responses)
        if entropy == "grad":
            return log_probs, entropy_from_logits(logits)
        if entropy == "metric":
            with torch.no_grad():
                return log_probs, entropy_from_logits(logits.detach())
        return log_probs, None

    @torch.no_grad()
    def _log_probs_batched(self, model: torch.nn.Module, batch: Batch, key: str) -> Batch:
        batch = batch.to(self.accelerator.device)
        temperature = batch.meta.get("temperature", 1.0)
        parts = [self._log_probs(model, mb, temperature)[0] for mb in batch.split(self.micro_batch_size)]
        return Batch({key: torch.cat(parts).cpu()})

    @shard
    def compute_log_probs(self, batch: Batch) -> Batch:
        """`old_log_probs` (B,R): the current policy's log-probs, before this step's update."""
        self.model.eval()
        return self._log_probs_batched(self.model, batch, "old_log_probs")

    @shard
    def compute_ref_log_probs(self, batch: Batch) -> Batch:
        """`ref_log_probs` (B,R) under the frozen reference policy."""
        if self.ref_model is None:
            raise RuntimeError(
                "compute_ref_log_probs was called but this policy worker has no reference model; "
                "set PolicyWorker.ref_model_path (the experiment's KL settings need it)."
            )
        return self._log_probs_batched(self.ref_model, batch, "ref_log_probs")

    # -------------------------------------------------------------- update
    def _global_sum(self, value: float) -> float:
        if self.world_size == 1:
            return value
        t = torch.tensor([value], dtype=torch.float64, device=self.accelerator.device)
        return float(self.accelerator.reduce(t, reduction="sum").item())

    @shard_exact
    def update(self, batch: Batch) -> dict[str, float]:
        """Train on this rank's shard: `epochs` x `mini_batches` optimizer steps, micro-batched.

        Losses are normalised by the global token/sequence counts of each mini-batch and
        multiplied by the world size (DDP averages gradients), so the update equals the update
        of one process on the whole global batch.
        """
        if self.objective is None:
            raise RuntimeError("this policy worker was built without an objective (inference only)")
        start = time.perf_counter()
        self.model.train()
        batch = batch.to(self.accelerator.device)
        temperature = batch.meta.get("temperature", 1.0)
        sums: dict[str, float] = defaultdict(float)
        weights: dict[str, float] = defaultdict(float)
        mini_size = math.ceil(len(batch) / self.mini_batches)
        grad_norms = []
        for _ in range(self.epochs):
            for mini in batch.split(mini_size):
                num_tokens = self._global_sum(float(mini["response_mask"].sum()))
                num_seqs = self._global_sum(float(len(mini)))
                self.optimizer.zero_grad(set_to_none=True)
                micros = mini.split(self.micro_batch_size)
                for i, micro in enumerate(micros):
                    sync = i == len(micros) - 1
                    ctx = contextlib.nullcontext() if sync else self.accelerator.no_sync(self.model)
                    with ctx:
                        with_grad = getattr(self.objective, "needs_entropy_grad", False)
                        mode = "grad" if with_grad else "metric"
                        log_probs, entropy = self._log_probs(self.model, micro, temperature, mode)
                        loss, metrics = self.objective(
                            log_probs, entropy, micro, num_tokens=num_tokens, num_seqs=num_seqs
                        )
                        self.accelerator.backward(loss * self.world_size)
                    tokens = float(micro["response_mask"].sum())
                    entropy_sum = float((entropy.detach() * micro["response_mask"]).sum())
                    metrics["actor/entropy"] = entropy_sum / max(tokens, 1.0)
                    for k, v in metrics.items():
                        sums[k] += v * tokens
                        weights[k] += tokens
                grad_norm = self._clip_grad()
                grad_norms.append(grad_norm)
                if math.isfinite(grad_norm):
                    self.optimizer.step()
                else:  # a non-finite gradient never reaches the weights
                    self.skipped_updates += 1
                    self.optimizer.zero_grad(set_to_none=True)
                if self.scheduler is not None:
                    self.scheduler.step()
        out = {k: sums[k] / max(weights[k], 1.0) for k in sums}
        out["actor/grad_norm"] = sum(grad_norms) / len(grad_norms)
        out["actor/lr"] = self.optimizer.param_groups[0]["lr"]
        out["actor/skipped_updates"] = float(self.skipped_updates)
        out["timing_s/update_worker"] = time.perf_counter() - start
        return out

    def _clip_grad(self) -> float:
        if self.grad_clip is None:
            norms = [p.grad.norm() for p in self.model.parameters() if p.grad is not None]
            return float(torch.linalg.vector_norm(torch.stack(norms))) if norms else 0.0
        return float(self.accelerator.clip_grad_norm_(self.model.parameters(), self.grad_clip))

    @on_all_ranks
    def requirements(self) -> dict[str, bool]:
        """What the driver must compute before `update`: old log-probs, reference log-probs.

        Old log-probs are skipped when provably on-policy (one epoch, one mini-batch): the
        update then uses the current log-probs, detached, as the old ones.
        """
        return {
            "old_log_probs": self.objective is not None and (self.epochs > 1 or self.mini_batches > 1),
            "ref": bool(getattr(self.objective, "needs_ref", False)),
        }

    # ------------------------------------------------------------ state I/O
    @on_all_ranks
    def save(self, path: str) -> str:
        """Write a Hugging Face model folder (weights + tokenizer) atomically; returns the path."""
        self.accelerator.wait_for_everyone()
        state = self.accelerator.get_state_dict(self.model)
        if self.accelerator.is_main_process:
            target = Path(path)
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
            self._unwrapped().save_pretrained(tmp, state_dict=state)
            self.tokenizer.save_pretrained(tmp)
            if target.exists():
                shutil.rmtree(target)
            os.rename(tmp, target)
        self.accelerator.wait_for_everyone()
        return path

    @on_all_ranks
    def parameters_digest(self) -> dict[str, torch.Tensor]:
        """A copy of the actor's parameters (tests compare ranks and runtimes with it)."""
        return {k: v.detach().cpu().clone() for k, v in self._unwrapped().state_dict().items()}
