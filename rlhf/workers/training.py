"""`ModelTrainer`: one trained model on one data-parallel rank, and its update loop.

Shared by the policy, the critic and the reward model: Accelerate owns processes, devices and
the DDP wrapper; FSDP2 is applied here (rlhf.workers.fsdp), the same code on GPUs and CPUs.
`update` runs `epochs x mini_batches` optimizer steps with micro-batch gradient
accumulation. Every loss is normalised by the GLOBAL token and sequence counts of its
mini-batch (summed over ranks) and multiplied by the world size, because DDP and FSDP average
gradients: the update then equals one process's update on the whole global batch.
A step whose gradient norm is not finite is skipped, so NaN/Inf never reach the weights.
Forwards run under the compute dtype's autocast (rlhf.workers.precision); the weights and
optimizer state stay in the dtype the model was loaded in (float32 for trained models).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import math
from collections import defaultdict
from collections.abc import Callable

import numpy as np
import torch

from rlhf.batch import Batch
from rlhf.io.atomic import atomic_write_dir
from rlhf.models.loading import ModelSource
from rlhf.models.saving import save_model_folder
from rlhf.ranges import NonNegativeInt, PositiveFloat, PositiveInt
from rlhf.workers import state_io
from rlhf.workers.accelerator import make_accelerator
from rlhf.workers.compiling import compile_layer_parts
from rlhf.workers.fsdp import (
    FSDP, Strategy, build_sharded, full_tensor, is_sharded, local_tensor, resolve_strategy, shard_model,
)
from rlhf.workers.micro_batches import MicroBatches, restore_order, split_by_tokens, unit_chunks
from rlhf.workers.precision import DType, autocast, torch_dtype

OptimizerFactory = Callable[..., torch.optim.Optimizer]
SchedulerFactory = Callable[[torch.optim.Optimizer], torch.optim.lr_scheduler.LRScheduler]
Metric = torch.Tensor | float  # a 0-d device tensor (no host sync) or a Python number
# (micro-batch, global tokens, global sequences) -> (loss, metrics averaged over its tokens); a metric given as
# (value, weight) is averaged over the micro-batches with that weight instead (e.g. its pairs)
MicroLoss = Callable[[Batch, float, float], tuple[torch.Tensor, dict[str, "Metric | tuple[Metric, float]"]]]


@dataclasses.dataclass(frozen=True)
class TrainingSetup:
    """How a worker's model is placed and trained: the knobs the policy, the critic and a reward model share.

    One node of the graph that every worker takes as `training=`: a recipe that adds a critic or a
    reward model passes the policy's node itself (fiddle shares a node referenced twice), so a later
    `set:...policy.worker.training.micro_batch_size=8` reaches every role at once. What is about one
    model stays on its worker: the storage `dtype`, the optimizer and its learning rate (a critic
    usually has its own, as in verl's separate actor and critic optim configs).
    """

    strategy: Strategy = "auto"  # "auto": FSDP on GPUs, DDP on CPUs; "fsdp" runs on CPUs too (gloo)
    compute_dtype: DType = "float32"  # matmuls (autocast) and frozen models' storage; "bfloat16" on GPUs
    micro_batch_size: PositiveInt = 64  # rows per forward/backward (gradient accumulation below it)
    # token budget per training micro-batch, rows x longest row (verl's ppo_max_token_len_per_gpu); None: rows
    max_tokens_per_micro_batch: PositiveInt | None = None
    max_tokens_per_forward: PositiveInt | None = None  # no-grad forwards' budget (log_prob_max_token_len_per_gpu)
    gradient_checkpointing: bool = False  # recompute activations in backward: less memory, ~30% more compute
    # torch.compile each decoder layer's norms and MLP (rlhf.workers.compiling): their element-wise ops fused;
    # the first forward and backward pay the compile (about 15 s for SmolLM2 on one CPU thread)
    compile: bool = False
    mini_batches: PositiveInt = 1  # optimizer steps per update call per epoch (PPO mini-batches)
    epochs: PositiveInt = 1  # passes over the batch per update call (PPO epochs)
    grad_clip: PositiveFloat | None = 1.0  # max global gradient norm; None: no clipping
    seed: NonNegativeInt = 0  # torch's seed on rank r is seed + r

    def trainer(
        self, model: torch.nn.Module | ModelSource, optimizer: OptimizerFactory | None,
        lr_scheduler: SchedulerFactory | None = None, prefix: str = "actor",
    ) -> ModelTrainer:
        """A `ModelTrainer` with these settings. Torch is seeded with `seed` before the model is built
        (what it initialises afresh, a LoRA adapter or a value head, starts the same in every run and on
        every rank) and with `seed + rank` after (sampling, dropout)."""
        torch.manual_seed(self.seed)
        trainer = ModelTrainer(model, optimizer, lr_scheduler, self, prefix)
        torch.manual_seed(self.seed + trainer.rank)
        return trainer


class ModelTrainer:
    """Owns a model, its optimizer and LR schedule on this rank, and trains it on Batches."""

    def __init__(
        self,
        model: torch.nn.Module | ModelSource,  # a source lets FSDP read the weights on one rank only
        optimizer: OptimizerFactory | None,  # None: the model is only evaluated (frozen)
        lr_scheduler: SchedulerFactory | None = None,
        setup: TrainingSetup = TrainingSetup(),  # placement, compute dtype, batching, clipping (its defaults)
        prefix: str = "actor",  # metric namespace: actor/grad_norm, critic/grad_norm ...
    ):
        self.accelerator = make_accelerator()
        self.setup = setup
        self.strategy = resolve_strategy(setup.strategy, self.accelerator.device.type == "cuda")
        # no-grad forwards fall back to the training budget
        self.max_tokens_per_forward = setup.max_tokens_per_forward or setup.max_tokens_per_micro_batch
        self.prefix = prefix
        torch_dtype(setup.compute_dtype, "compute_dtype")
        self.skipped_steps = 0
        self.model = place_model(model, self.strategy, self.accelerator.device, setup.compute_dtype,
                                 gradient_checkpointing=setup.gradient_checkpointing and optimizer is not None,
                                 compile=setup.compile)
        self.rank = self.accelerator.process_index
        self.world_size = self.accelerator.num_processes
        self.optimizer = self.scheduler = None
        if optimizer is None:
            self.model.eval().requires_grad_(False)
            return
        trainable = [p for p in self.model.parameters() if p.requires_grad]  # frozen weights get no optimizer state
        if isinstance(self.strategy, FSDP):  # sharded already; Accelerate only wraps the optimizer
            self.optimizer = self.accelerator.prepare_optimizer(build_optimizer(optimizer, trainable))
        else:
            self.model, self.optimizer = self.accelerator.prepare(self.model, build_optimizer(optimizer, trainable))
        self.scheduler = lr_scheduler(self.optimizer) if lr_scheduler is not None else None
        if self.scheduler is not None:  # registered only to restore Accelerate-format checkpoints (state_io); not prepared
            self.accelerator.register_for_checkpointing(self.scheduler)

    @property
    def device(self) -> torch.device:
        return self.accelerator.device

    def unwrapped(self) -> torch.nn.Module:
        return self.accelerator.unwrap_model(self.model)

    def autocast(self) -> contextlib.AbstractContextManager:
        """The compute-dtype context every forward of this trainer's models runs in."""
        return autocast(self.device, self.setup.compute_dtype)

    def global_sum(self, value: float) -> float:
        if self.world_size == 1:
            return value
        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        return float(self.accelerator.reduce(t, reduction="sum").item())

    def micro_batches(self, batch: Batch, max_tokens: int | None = None, whole_units: bool = False) -> MicroBatches:
        """`batch` (on the host) cut into the micro-batches one forward/backward processes.

        With a token budget: rows grouped by length, each micro-batch trimmed to its longest row
        (rlhf.workers.micro_batches.split_by_tokens); every rank then runs as many micro-batches
        as the rank that needs most (FSDP's collectives need the same number of forwards).
        Without one: `micro_batch_size` rows each, in order. `whole_units`: a unit of rows
        (`row_units`: the same `uid`, e.g. a preference pair) is never split between micro-batches.
        """
        if max_tokens is None:
            if whole_units:
                chunks = unit_chunks(batch, self.setup.micro_batch_size)
                return MicroBatches([batch.index(c) for c in chunks], np.concatenate(chunks), 0)
            parts = batch.split(self.setup.micro_batch_size)
            return MicroBatches(parts, np.arange(len(batch)), 0)
        split = split_by_tokens(batch, max_tokens, whole_units=whole_units)
        if self.world_size > 1:
            most = int(self.accelerator.gather(torch.tensor([len(split.parts)], device=self.device)).max())
            if most > len(split.parts):
                split = split_by_tokens(batch, max_tokens, min_micro_batches=most, whole_units=whole_units)
        return split

    def map_micro_batches(self, batch: Batch, forward: Callable[[Batch], torch.Tensor]) -> torch.Tensor:
        """`forward` (no grad) on every micro-batch moved to the device; the per-row (B, R) results
        on the host, in `batch`'s row order and at its response width (zeros where trimmed)."""
        split = self.micro_batches(batch, self.max_tokens_per_forward)
        parts = [forward(micro.to(self.device)).cpu() for micro in split.parts]
        return restore_order(parts, split.order, batch["responses"].shape[1])

    def update(self, batch: Batch, micro_loss: MicroLoss, whole_units: bool = False,
               inert_rows: Callable[[Batch], torch.Tensor] | None = None) -> dict[str, float]:
        """Optimise `micro_loss` over this rank's shard; returns token-weighted mean metrics.

        Token and sequence counts come from the host copy of the batch and metrics are summed
        on the device, so the loop's only host syncs are the gradient-norm check per optimizer
        step and one transfer of all metrics at the end. No gradient outlives the call.
        `whole_units`: mini- and micro-batches never split a unit of rows (`micro_batches`): a loss
        over preference pairs needs the chosen and the rejected row of each pair together.
        `inert_rows`: (B,) bool of a mini-batch, the rows that add nothing to `micro_loss` or its gradient; they
        are left out of the forward and backward after the mini-batch's global counts are taken (so the loss is
        unchanged). One is kept where all are: every rank runs a forward and the optimizer steps on zeros.
        """
        if self.optimizer is None:
            raise RuntimeError(f"the {self.prefix} model was built without an optimizer (evaluation only)")
        self.model.train()
        batch = batch.to("cpu")
        sums: dict[str, Metric] = {}
        weights: dict[str, float] = defaultdict(float)
        mini_size = math.ceil(len(batch) / self.setup.mini_batches)
        minis = ([batch.index(c) for c in unit_chunks(batch, mini_size)] if whole_units and self.setup.mini_batches > 1
                 else batch.split(mini_size))
        grad_norms: list[float] = []
        skipped = over_budget = micro_count = left_out = 0
        for _ in range(self.setup.epochs):
            for mini in minis:
                num_tokens = self.global_sum(float(mini["response_mask"].sum()))
                num_seqs = self.global_sum(float(len(mini)))
                if inert_rows is not None:
                    rows = len(mini)
                    mini = without_inert_rows(mini, inert_rows(mini))
                    left_out += rows - len(mini)
                self.optimizer.zero_grad(set_to_none=True)
                split = self.micro_batches(mini, self.setup.max_tokens_per_micro_batch, whole_units)
                micros, over_budget = split.parts, over_budget + split.over_budget
                if inert_rows is not None and self.world_size > 1:  # ranks kept different numbers of rows
                    micros = self._as_many_as_every_rank(micros)
                for i, micro in enumerate(micros):
                    tokens = float(micro["response_mask"].sum())
                    with self._gradient_sync(last=i == len(micros) - 1):
                        with self.autocast():
                            loss, metrics = micro_loss(micro.to(self.device), num_tokens, num_seqs)
                        self.accelerator.backward(loss * self.world_size)
                    for k, v in metrics.items():
                        v, weight = v if isinstance(v, tuple) else (v, tokens)
                        sums[k] = sums.get(k, 0.0) + v * weight
                        weights[k] += weight
                micro_count += len(micros)
                grad_norm = float(self._clip_grad())  # the one host sync per optimizer step
                grad_norms.append(grad_norm)
                if math.isfinite(grad_norm):
                    self.optimizer.step()
                else:  # a non-finite gradient never reaches the weights
                    skipped += 1
                    self.optimizer.zero_grad(set_to_none=True)
                if self.scheduler is not None:
                    self.scheduler.step()
        # the gradients would otherwise stay allocated (a full copy of the trained weights) through
        # the next rollout and log-prob passes, until the next update zeroes them anyway
        self.optimizer.zero_grad(set_to_none=True)
        self.skipped_steps += skipped
        out = dict(zip(sums, _to_floats(list(sums.values()))))
        out = {k: v / max(weights[k], 1.0) for k, v in out.items()}
        finite = [g for g in grad_norms if math.isfinite(g)]
        out[f"{self.prefix}/grad_norm"] = sum(finite) / len(finite) if finite else float("nan")
        out[f"{self.prefix}/lr"] = self.optimizer.param_groups[0]["lr"]
        out[f"{self.prefix}/nonfinite_steps"] = float(skipped)
        out[f"{self.prefix}/micro_batches"] = float(micro_count)
        if inert_rows is not None:  # share of the rows left out of the forward and backward
            out[f"{self.prefix}/inert_rows_left_out"] = left_out / max(len(batch) * self.setup.epochs, 1)
        if self.setup.max_tokens_per_micro_batch is not None:  # rows wider than the budget, each run alone
            out[f"{self.prefix}/rows_over_token_budget"] = float(over_budget)
        return out

    def _as_many_as_every_rank(self, micros: list[Batch]) -> list[Batch]:
        """`micros` and, where another rank runs more, copies of one row with no response token (a loss and a
        gradient of 0): FSDP's collectives need the same number of forwards and backwards on every rank."""
        most = int(self.accelerator.gather(torch.tensor([len(micros)], device=self.device)).max())
        blank = micros[0].index([0])
        blank["response_mask"] = torch.zeros_like(blank["response_mask"])
        return micros + [blank] * (most - len(micros))

    def _gradient_sync(self, last: bool) -> contextlib.AbstractContextManager:
        """DDP all-reduces only after the last micro-batch (its gradients are full replicas anyway).
        FSDP reduce-scatters after every micro-batch, so each rank only ever holds its shard of the
        gradients (`no_sync` there would keep full unsharded gradients: 28 GB for 7B in fp32)."""
        if last or is_sharded(self.model):
            return contextlib.nullcontext()
        return self.accelerator.no_sync(self.model)

    def _clip_grad(self) -> torch.Tensor:
        """The global gradient norm (clipped to `grad_clip` when set); under FSDP the norm of the
        sharded gradients is reduced over ranks (`full_tensor`)."""
        params = [p for p in self.model.parameters() if p.grad is not None]
        if self.setup.grad_clip is None:
            norm = torch.nn.utils.get_total_norm([p.grad for p in params]) if params else torch.zeros(())
        else:
            norm = torch.nn.utils.clip_grad_norm_(params, self.setup.grad_clip)
        return full_tensor(norm)

    # ------------------------------------------------------------ state I/O
    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Every weight, whole, on the host of rank 0 (an empty dict elsewhere); every rank must call it."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        state = get_model_state_dict(self.unwrapped(), options=options)
        return state if self.accelerator.is_main_process else {}

    def save_pretrained(self, path: str, tokenizer=None) -> str:
        """A Hugging Face model folder (weights + tokenizer), gathered to and written atomically by rank 0."""
        self.accelerator.wait_for_everyone()
        state = self.full_state_dict()
        if self.accelerator.is_main_process:
            atomic_write_dir(path, lambda tmp: save_model_folder(tmp, self.unwrapped(), tokenizer, state))
        self.accelerator.wait_for_everyone()
        return path

    def save_state(self, path: str) -> None:
        """Model, optimizer, LR scheduler and every rank's RNG states as a sharded checkpoint: each
        rank writes its own shards into `path` (rlhf.workers.state_io); every rank must call it."""
        state_io.save_state(path, self.unwrapped(), self.optimizer, self.scheduler)

    def load_state(self, path: str) -> None:
        """Resume from `save_state`'s folder (at any world size, DDP or FSDP); a folder in
        Accelerate's former format loads under DDP and raises CheckpointFormatError under FSDP."""
        if state_io.is_accelerate_state(path):
            if isinstance(self.strategy, FSDP):
                raise state_io.CheckpointFormatError(
                    f"{path} is in Accelerate's former checkpoint format (full weights in model.safetensors), which "
                    "does not restore a sharded optimizer. Resume it once with strategy='ddp' (it then saves sharded "
                    "checkpoints that FSDP reads), or export it (`rlhf export`) and start a new run from that folder."
                )
            self.accelerator.load_state(path)
            return
        state_io.load_state(path, self.unwrapped(), self.optimizer, self.scheduler)

    def parameters_finite(self) -> bool:
        """Whether this rank's parameters (its shards under FSDP) are all finite."""
        return all(torch.isfinite(local_tensor(p)).all() for p in self.unwrapped().parameters())


def without_inert_rows(batch: Batch, inert: torch.Tensor) -> Batch:
    """`batch` without the rows flagged in `inert` (B,) bool, in their order; where every row is inert, the one
    with the fewest response tokens stays (a forward on each rank, and a gradient of exact zeros)."""
    keep = ~inert.cpu()
    if not bool(keep.any()):
        keep[int(batch["response_mask"].sum(dim=-1).argmin())] = True
    return batch if bool(keep.all()) else batch.index(keep.nonzero().squeeze(-1))


def build_optimizer(factory: OptimizerFactory, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """`factory(params)`, on torch's fused Adam/AdamW kernel where the factory leaves the choice open.

    torch's Adam and AdamW take `fused` and `foreach`; left at None they loop over the parameters
    tensor by tensor on a CPU (foreach is their default on CUDA only). The fused kernel does the
    same update in one pass per tensor: several times faster on a CPU (AdamW over SmolLM2-135M:
    0.06 s against 0.44 s on one thread) and on a GPU, with weights equal up to float rounding
    (tests/workers/test_optimizer_build.py); FSDP2's sharded parameters support it too. A factory
    that sets `fused` or `foreach` keeps its choice, and so do other optimizers (DTensor has no
    sharding rule for fused SGD or Adagrad) and parameters on a device without fused kernels.
    """
    cls = factory
    while isinstance(cls, functools.partial):
        cls = cls.func
    if not (isinstance(cls, type) and issubclass(cls, (torch.optim.Adam, torch.optim.AdamW))):
        return factory(params)
    arguments = inspect.signature(factory).parameters
    open_choice = arguments["fused"].default is None and arguments["foreach"].default is None
    supported = params and all(p.device.type in _FUSED_DEVICES and p.is_floating_point() for p in params)
    return factory(params, fused=True) if open_choice and supported else factory(params)


try:  # the devices torch's optimizers have fused kernels for
    from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

    _FUSED_DEVICES = frozenset(_get_fused_kernels_supported_devices())
except ImportError:
    _FUSED_DEVICES = frozenset({"cpu", "cuda"})


def place_model(
    model: torch.nn.Module | ModelSource, strategy: Strategy, device: torch.device, compute_dtype: DType,
    gradient_checkpointing: bool = False,
    compile: bool = False,
) -> torch.nn.Module:
    """`model` on this rank as `strategy` wants it: sharded by FSDP2 (from a source, its weights
    read by rank 0 only) or whole on the device (DDP wraps it later, with its optimizer).
    `compile`: its decoder layers' norms and MLPs compiled in place (rlhf.workers.compiling).

    Under FSDP the layers compute in `compute_dtype` after all-gather while the shards keep the
    stored dtype (float32 masters for trained models) and gradients reduce in float32.
    """
    strategy = resolve_strategy(strategy, device.type == "cuda")

    def prepare(module: torch.nn.Module) -> torch.nn.Module:
        if gradient_checkpointing:
            _enable_gradient_checkpointing(module)
        if not isinstance(strategy, FSDP):
            return module.to(device)
        stored = next(module.parameters()).dtype
        compute = torch_dtype(compute_dtype, "compute_dtype")
        return shard_model(module, strategy, device, param_dtype=None if compute == stored else compute)

    if isinstance(strategy, FSDP) and isinstance(model, ModelSource):
        host = torch.device("cpu") if strategy.cpu_offload else None  # CPUOffloadPolicy keeps shards on the host
        placed = build_sharded(model.load, model.skeleton, prepare, device, shard_device=host)
    else:
        placed = prepare(model.load() if isinstance(model, ModelSource) else model)
    if compile:
        compile_layer_parts(placed)
    return placed


def _enable_gradient_checkpointing(model: torch.nn.Module) -> None:
    if hasattr(model, "activation_checkpointing_enable"):  # transformers 5 renamed it
        model.activation_checkpointing_enable({"use_reentrant": False})
    elif hasattr(model, "gradient_checkpointing_enable"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    else:
        raise ValueError(f"gradient_checkpointing=True needs a Hugging Face model; got {type(model).__name__}")


def _to_floats(values: list[Metric]) -> list[float]:
    """Python floats from a mix of numbers and device tensors, with one transfer for the tensors."""
    tensors = [v for v in values if isinstance(v, torch.Tensor)]
    host = iter(torch.stack([t.detach().float() for t in tensors]).tolist()) if tensors else iter(())
    return [next(host) if isinstance(v, torch.Tensor) else float(v) for v in values]
