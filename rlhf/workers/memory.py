"""Peak memory of a worker predicted from its model's config and its settings, before any weight loads.

Each worker class has a `predict_memory(arguments, workload, placement)` beside it (policy, critic,
reward model) that composes the terms below; the preflight sums the roles that share a device
(`rlhf.runtime.preflight.memory`). Everything is arithmetic on a `ModelShape` (read from a
`config.json`, or written by hand in tests): nothing is loaded, nothing is allocated.

What is counted, per device and rank (B rows, T tokens per row, N = B x T tokens per micro-batch;
P parameters; H hidden, I intermediate, L layers, V vocabulary; q = heads x head_dim, kv = KV heads x
head_dim; sizes in the dtype each tensor has):

- state that lives through the step: trained weights in float32 (FSDP: a 1/world shard each; CPU
  offload moves them, their gradients and the optimizer state to host RAM), their gradients
  (float32, during an update only: `ModelTrainer.update` frees them when it returns; a DDP-wrapped
  model keeps a second copy in its buckets for good), AdamW's two moments (float32, created at the
  first step), frozen models (reference, reward model) in their storage dtype;
- saved activations of a training micro-batch, per layer and token: 6H + 4I + 4q + heads + T + 2
  elements (transformers' Llama/Qwen2 layer under SDPA, counted tensor by tensor from the autograd
  graph: the two RMSNorms keep input, normalised and output; the MLP keeps gate, its activation,
  up and their product; attention keeps query, key and value expanded to every head, its output,
  its log-sum-exp and the (B, 1, T, T) mask); with gradient checkpointing one layer input (H) per
  layer, plus one layer's activations recomputed in backward;
- the LM head: the (B, R+1, V) logits of the response positions in the compute dtype, their
  gradient and the full-width gradient autograd builds for the slice, and the float32 blocks of the
  log-prob/entropy kernel (`rlhf.algos.logprobs`: up to 3 blocks of `block_rows` x V). With the fused
  head (`rlhf.models.lm_head`, the default) a GPU recomputes the logits in backward (blocks only) and
  a CPU keeps them once in float32, turned into their gradient in place; no-grad forwards keep none;
- no-grad forwards (old/reference log-probs, values, rewards): one layer's transient tensors
  (4.5H + max(3I, 3q + 4kv) + T/4 elements per token) plus the logits as above, without gradients;
- generation with the transformers engine: the KV cache of the rows decoded at once, for
  prompt + new tokens (2 x L x kv elements per token), the prompt prefill's own cache and one
  layer's transients, the decoder's copies of the fused projection weights (besides the layers'
  weights in the compute dtype when it differs from storage, or gathered under FSDP on several
  ranks), and a few (B, V) float32 sampling temporaries; vLLM: its share of the device
  (`gpu_memory_utilization`), which sleeps (freed) while the trainer runs on GPUs;
- FSDP2 (`rlhf.workers.fsdp.shard_model`: each decoder layer, then the root): the layer being
  computed gathered (with its all-gather output on several ranks), and the root group (embedding,
  final norm, head) gathered in the compute dtype from a forward to the end of the next backward
  (the root does not reshard after forward): a frozen model's for good; on several ranks the first
  forward also holds the root's all-gather output until the first layer is gathered; in backward
  the root's unsharded gradients (the LM head's from the start, the embedding's at the end) before
  their reduce-scatter. A phase's peak is its largest moment (`largest`, `update_terms`): an update's
  activation peak (gradients only from an earlier micro-batch of the same optimizer step), the end
  of backward, or the optimizer step.

Validated against measured live tensor bytes on CPU (benchmarks/memory_plan.py, docs/memory.md).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from rlhf.models.loading import resolve_model_path

__all__ = [
    "GiB", "MemoryEstimate", "ModelShape", "Phase", "Placement", "Term", "Workload", "dtype_bytes", "model_shape",
    "between_updates", "forward_terms", "frozen_model_terms", "fsdp_forward_start_terms", "fsdp_root_terms",
    "generation_terms", "largest", "log_prob_block_terms", "logit_terms", "root_group_parameters",
    "shared_prefix_backward_terms", "trained_model_terms", "training_activation_terms", "update_terms",
]

GiB = 2**30
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
CPU_BLOCK_ELEMENTS = 2**24  # rlhf.algos.logprobs.MAX_BLOCK_ELEMENTS (kept equal by a test)
GPU_BLOCK_ELEMENTS = 2**28  # rlhf.algos.logprobs.MAX_BLOCK_ELEMENTS_GPU


def dtype_bytes(name: str) -> int:
    if name not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {name!r}; one of {', '.join(DTYPE_BYTES)}")
    return DTYPE_BYTES[name]


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """The numbers of a decoder-only transformer that memory depends on."""

    vocab: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    tied_embeddings: bool = False
    attention_bias: bool = False  # q/k/v biases (Qwen2)
    name: str = ""

    @classmethod
    def from_config(cls, config: dict | str | os.PathLike) -> ModelShape:
        """From a Hugging Face `config.json` (a dict, the file, or its model folder): nothing else is read."""
        if not isinstance(config, dict):
            config = _read_config(str(config))
        c = dict(config.get("text_config") or {}, **{k: v for k, v in config.items() if k != "text_config"})
        missing = [k for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                               "num_attention_heads") if c.get(k) is None]
        if missing:
            raise ValueError(f"the model config has no {', '.join(missing)}: the memory planner reads decoder-only "
                             "transformer configs (Llama, Qwen2, Mistral and alike)")
        heads = int(c["num_attention_heads"])
        return cls(
            vocab=int(c["vocab_size"]), hidden=int(c["hidden_size"]), intermediate=int(c["intermediate_size"]),
            layers=int(c["num_hidden_layers"]), heads=heads, kv_heads=int(c.get("num_key_value_heads") or heads),
            head_dim=int(c.get("head_dim") or c["hidden_size"] // heads),
            tied_embeddings=bool(c.get("tie_word_embeddings", False)),
            attention_bias=bool(c.get("attention_bias", c.get("model_type") == "qwen2")),
            name=str(c.get("_name_or_path") or c.get("model_type") or ""),
        )

    @property
    def q(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def layer_parameters(self) -> int:
        h = self.hidden
        attention = h * (self.q + 2 * self.kv) + self.q * h + ((self.q + 2 * self.kv) if self.attention_bias else 0)
        return attention + 3 * h * self.intermediate + 2 * h

    def parameters(self, head: str = "lm") -> int:
        """Parameter count with `head` "lm" (causal LM), "value" (one label per token: the critic) or
        "score" (one label per sequence, no bias: a reward model)."""
        body = self.vocab * self.hidden + self.layers * self.layer_parameters + self.hidden
        if head == "lm":
            return body + (0 if self.tied_embeddings else self.vocab * self.hidden)
        return body + self.hidden + (1 if head == "value" else 0)

    @property
    def fused_projection_parameters(self) -> int:
        """Weights the lean decoder concatenates (q/k/v and gate/up: new tensors)."""
        return self.layers * self.hidden * (self.q + 2 * self.kv + 2 * self.intermediate)


def model_shape(model: ModelShape | str | os.PathLike) -> ModelShape:
    """A `ModelShape` as given, or read from a model folder's config.json (a known model name resolves
    as `rlhf.models.loading.resolve_model_path` does)."""
    if isinstance(model, ModelShape):
        return model
    from_folder = Path(model).expanduser()
    if not from_folder.exists():
        from_folder = Path(resolve_model_path(str(model)))
    return ModelShape.from_config(str(from_folder))


@functools.cache
def _read_config(path: str) -> dict:
    file = Path(path)
    if file.is_dir():
        file = file / "config.json"
    if not file.is_file():
        raise FileNotFoundError(f"no model config at {path} (the memory planner reads config.json only)")
    return json.loads(file.read_text())


@dataclasses.dataclass(frozen=True)
class Term:
    """One consumer of memory: what it is and its bytes."""

    name: str
    bytes: float


@dataclasses.dataclass(frozen=True)
class Phase:
    """The memory alive at the peak of one phase of a step (update, log-probs, generation ...)."""

    name: str
    terms: tuple[Term, ...]

    @property
    def bytes(self) -> float:
        return sum(t.bytes for t in self.terms)


@dataclasses.dataclass(frozen=True)
class MemoryEstimate:
    """A role's predicted memory per device: on the accelerator (or the host on a CPU run) and in host RAM
    (CPU offload), per phase; the peak is the largest phase."""

    role: str
    phases: tuple[Phase, ...]
    host: tuple[Term, ...] = ()  # host RAM held outside the device (FSDP CPU offload)

    @property
    def peak_phase(self) -> Phase:
        return max(self.phases, key=lambda p: p.bytes)

    @property
    def peak(self) -> float:
        return self.peak_phase.bytes if self.phases else 0.0

    def phase(self, name: str) -> Phase:
        return next(p for p in self.phases if p.name == name)


@dataclasses.dataclass(frozen=True)
class Workload:
    """What one rank of a role processes in a step (the trainer's settings, split over data-parallel ranks)."""

    prompt_tokens: int  # the longest prompt (left-padded width)
    response_tokens: int  # max new tokens
    n: int = 1  # samples per prompt (GRPO group size)
    rows: int = 1  # rows per rank per step (prompts x n / data-parallel ranks)
    mini_batches: int = 1  # optimizer steps per epoch: rows per update mini-batch = rows / mini_batches
    generate: bool = True  # the policy generates this step's rollouts

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.response_tokens


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where a role runs: device kind, data-parallel ranks and the strategy `auto` resolved to."""

    device: str = "cpu"  # "cuda" or "cpu"
    world_size: int = 1
    fsdp: bool = False
    cpu_offload: bool = False
    device_bytes: float | None = None  # the device's memory (vLLM's share is a fraction of it)
    # the rank runs in a torch.distributed process group (Ray sets one up even for one rank; LocalRuntime
    # does not): Accelerate then wraps a DDP model in DistributedDataParallel, whose buckets copy the gradients
    process_group: bool = False

    @property
    def ddp_wrapped(self) -> bool:
        return not self.fsdp and (self.world_size > 1 or self.process_group)

    @property
    def shard(self) -> int:
        return self.world_size if self.fsdp else 1


def micro_batch(rows: int, width: int, micro_batch_size: int, max_tokens: int | None) -> tuple[int, int]:
    """(rows, width) of the largest micro-batch a worker cuts from `rows` rows of `width` tokens
    (`ModelTrainer.micro_batches`: a token budget, else `micro_batch_size` rows)."""
    rows = max(1, rows)
    if max_tokens is None:
        return min(rows, micro_batch_size), width
    return max(1, min(rows, max_tokens // max(1, width))), width


# --------------------------------------------------------------------------- terms
def trained_model_terms(
    shape: ModelShape, head: str, placement: Placement, optimizer_states: int = 2, label: str = "",
) -> tuple[list[Term], list[Term]]:
    """(device terms, host terms) of a trained model's steady state: float32 weights, gradients and
    `optimizer_states` float32 moments per parameter (AdamW: 2), sharded by FSDP; CPU offload puts
    them on the host."""
    p = shape.parameters(head) / placement.shard
    prefix = f"{label} " if label else ""
    terms = [Term(f"{prefix}weights (fp32)", 4 * p), Term(f"{prefix}gradients (fp32)", 4 * p)]
    if optimizer_states:
        terms.append(Term(f"{prefix}optimizer state (fp32 x {optimizer_states})", 4 * p * optimizer_states))
    if placement.ddp_wrapped:
        terms.append(Term(f"{prefix}DDP gradient buckets", 4 * p))
    if placement.cpu_offload:
        return [], terms
    return terms, []


def between_updates(terms: list[Term]) -> list[Term]:
    """`terms` without the trained models' gradients, which `ModelTrainer.update` frees when it returns
    (a DDP wrapper's gradient buckets stay)."""
    return [t for t in terms if not t.name.endswith("gradients (fp32)")]


def frozen_model_terms(shape: ModelShape, head: str, dtype: str, placement: Placement, label: str) -> list[Term]:
    """A frozen model (reference, reward model) in its storage dtype, sharded by FSDP, with its root
    group gathered for good after its first forward (`fsdp_root_terms`)."""
    return [Term(f"{label} weights ({dtype})", dtype_bytes(dtype) * shape.parameters(head) / placement.shard),
            *fsdp_root_terms(shape, head, dtype, placement, label)]


def _layer_saved_elements(shape: ModelShape, width: int) -> float:
    """Elements one decoder layer keeps for backward, per token (see the module docstring)."""
    return 6 * shape.hidden + 4 * shape.intermediate + 4 * shape.q + shape.heads + width + 2


def _layer_transient_elements(shape: ModelShape, width: int) -> float:
    """Elements alive at once inside one layer's no-grad forward, per token."""
    return 4.5 * shape.hidden + max(3 * shape.intermediate, 3 * shape.q + 4 * shape.kv) + width / 4


def _gathered_layer_bytes(shape: ModelShape, compute: str, placement: Placement) -> float:
    """The decoder layer FSDP2 has unsharded, in the compute dtype: on several ranks its all-gather output
    and the parameters copied out of it (the output is freed after the next layer's copy-out); on one rank
    the parameters alone (copied straight from the shard, no collective)."""
    if not placement.fsdp:
        return 0.0
    return (2 if placement.world_size > 1 else 1) * dtype_bytes(compute) * shape.layer_parameters


def root_group_parameters(shape: ModelShape, head: str) -> int:
    """Parameters outside the decoder layers: the embedding, the final norm and the head, which
    `rlhf.workers.fsdp.shard_model` leaves to the root's `fully_shard` (FSDP2's root group)."""
    return shape.parameters(head) - shape.layers * shape.layer_parameters


def fsdp_root_terms(shape: ModelShape, head: str, dtype: str, placement: Placement, label: str = "") -> list[Term]:
    """FSDP2's root group gathered: the embedding, final norm and head unsharded in the compute dtype.

    `fully_shard(model)` without `reshard_after_forward` leaves the root unsharded after its forward
    (FSDP2's default for the root: backward needs it at once), so the gathered parameters stay until
    the end of the next backward: through a trained model's generation, no-grad forwards and update
    (not its optimizer step), and for good in a frozen model (reference, reward), which runs no
    backward. A tied LM head is the embedding: counted once. On one rank too (a copy of the shard)."""
    if not placement.fsdp:
        return []
    prefix = f"{label} " if label else ""
    return [Term(f"{prefix}FSDP root group gathered: embedding/head ({dtype})",
                 dtype_bytes(dtype) * root_group_parameters(shape, head))]


def fsdp_forward_start_terms(shape: ModelShape, head: str, compute: str, placement: Placement) -> list[Term]:
    """Besides the gathered root, at the start of the first forward that gathers it on several ranks: the
    root's all-gather output (FSDP2 frees it only after the next group's copy-out, the first layer's,
    to overlap the two) and that layer gathered. One rank gathers without a buffer: nothing."""
    if not (placement.fsdp and placement.world_size > 1):
        return []
    return [Term("FSDP root all-gather buffer (until the first layer is gathered)",
                 dtype_bytes(compute) * root_group_parameters(shape, head)),
            Term("FSDP gathered layers", _gathered_layer_bytes(shape, compute, placement))]


def largest(*moments: list[Term]) -> list[Term]:
    """The terms of the moment with the most bytes: a phase's peak is one moment, not a sum of all."""
    return max(moments, key=lambda terms: sum(t.bytes for t in terms))


def update_terms(
    shape: ModelShape, head: str, compute: str, placement: Placement, device: list[Term], activations: list[Term],
    micro_batches: int, label: str = "", frozen_base: bool = False, blocks: list[Term] | None = None,
    late_backward: list[Term] | None = None, recomputed: list[Term] | None = None,
) -> list[Term]:
    """An update's peak: the largest of its moments, on top of a trained model's `device` terms (whose
    gradients exist only from the first backward of an optimizer step on: `ModelTrainer.update` sets them
    to None at each step's start).

    - the activation peak, the start of a micro-batch's backward: `activations` (saved tensors, logits),
      under FSDP the root group gathered, and either the log-prob kernel's `blocks` (its backward) or,
      made right after them, the LM head's gradient (the other gradients only if an earlier micro-batch
      of the step made them; under FSDP the head's is unsharded in the compute dtype until the
      reduce-scatter at the end of backward);
    - under FSDP, the end of backward: every gradient, the root still gathered, and its unsharded
      gradients before their reduce-scatter: the embedding's and the LM head's (a tied head's are summed
      into one, after both exist); without FSDP a tied embedding's own gradient beside the head's;
    - the optimizer step: every gradient and AdamW's temporaries (the root is resharded by then);
    - under FSDP on several ranks, the start of a micro-batch's forward (`fsdp_forward_start_terms`).

    `frozen_base`: an adapter trains, the embedding and head do not (no gradient of theirs).
    `late_backward`: what a later moment of the backward holds instead of `activations`
    (`shared_prefix_backward_terms`). `recomputed`: with gradient checkpointing, the layers' inputs
    and one layer recomputed, which recur in every layer's backward up to the first layer's, when
    nearly every gradient exists (the logits are freed by then; under FSDP the head's unsharded
    gradient is not).
    """
    grads = [t for t in device if t.name.endswith("gradients (fp32)")]
    rest = [t for t in device if t not in grads]
    earlier = grads if micro_batches > 1 else []
    root = fsdp_root_terms(shape, head, compute, placement, label)
    head_elements = shape.vocab * shape.hidden if head == "lm" and not frozen_base else 0
    if frozen_base:
        head_grad, end = [], []
    elif placement.fsdp:
        head_grad = [Term("LM head gradient, unsharded (before its reduce-scatter)",
                          dtype_bytes(compute) * head_elements)] if head_elements else []
        end = [Term("FSDP root group gradients, unsharded: embedding/head",
                    dtype_bytes(compute) * (shape.vocab * shape.hidden + head_elements))]
    else:
        head_grad = [Term("LM head gradient (fp32)", 4 * head_elements)] if head_elements and not earlier else []
        tied = head_elements and shape.tied_embeddings
        end = [Term("tied embedding's own gradient (before it is added to the head's)", 4 * head_elements)] \
            if tied else []
    moments = [rest + earlier + root + activations + largest(blocks or [], head_grad),
               device + optimizer_step_terms(shape, head, placement)]
    if end:
        moments.append(device + root + end)
    if placement.fsdp:
        moments.append(rest + earlier + root + fsdp_forward_start_terms(shape, head, compute, placement))
    if late_backward:
        moments.append(rest + earlier + root + late_backward)
    if recomputed:
        moments.append(device + root + (head_grad if placement.fsdp else []) + recomputed)
    return largest(*moments)


def training_activation_terms(
    shape: ModelShape, rows: int, width: int, compute: str, gradient_checkpointing: bool, placement: Placement,
) -> list[Term]:
    """Activations saved for backward of one micro-batch of `rows` x `width` tokens."""
    n, b = rows * width, _act_bytes(compute)
    per_layer = _layer_saved_elements(shape, width) * n * b
    embedding = (2 * shape.hidden + 1) * n * b + 2 * shape.head_dim * n * 4  # final norm, rotary cos/sin
    if gradient_checkpointing:
        terms = [Term(f"checkpointed layer inputs ({shape.layers} x {rows}x{width} tokens)",
                      shape.layers * shape.hidden * n * b),
                 Term("one layer recomputed in backward", per_layer)]
    else:
        terms = [Term(f"activations ({shape.layers} layers x {rows}x{width} tokens)", shape.layers * per_layer)]
    terms.append(Term("final norm and rotary tables", embedding))
    gathered = _gathered_layer_bytes(shape, compute, placement)
    if gathered:
        terms.append(Term("FSDP gathered layers", gathered))
    return terms


def log_prob_block_terms(
    shape: ModelShape, rows: int, positions: int, train: bool, device: str, block_elements: int | None = None,
    temperature_copy: bool = True,
) -> list[Term]:
    """The float32 blocks of the log-prob/entropy kernel (`rlhf.algos.logprobs`): up to 3 blocks of
    `block_rows` x V in training, 1 (2 with the temperature's copy) without gradients."""
    budget = block_elements or (GPU_BLOCK_ELEMENTS if device == "cuda" else CPU_BLOCK_ELEMENTS)
    tokens = rows * positions
    block = max(1, min(budget // max(shape.vocab, 1), math.ceil(tokens / 4))) * shape.vocab * 4
    return [Term("log-prob blocks (fp32)", (3 if train else (1 + temperature_copy)) * block)]


def logit_terms(
    shape: ModelShape, rows: int, positions: int, compute: str, fused: bool, train: bool, device: str,
    block_elements: int | None = None, temperature_copy: bool = True, with_blocks: bool = True,
) -> list[Term]:
    """The LM head's share: logits of `positions` response positions per row (the last position
    too, as `logits_to_keep` keeps it), their gradients when training, and the float32 blocks
    (`log_prob_block_terms`; `with_blocks=False`: without them). Fused
    (`rlhf.algos.linear_log_probs_and_entropy`): blocks only, and in training on a CPU the
    float32 logits it keeps for backward (`PolicyWorker.keep_logits`)."""
    terms = log_prob_block_terms(shape, rows, positions, train, device, block_elements, temperature_copy) \
        if with_blocks else []
    tokens = rows * positions
    if fused:
        if train and device != "cuda":
            terms.insert(0, Term(f"kept logits ({rows}x{positions}x{shape.vocab}, fp32)", tokens * shape.vocab * 4))
        return terms
    logits = rows * (positions + 1) * shape.vocab * dtype_bytes(compute)
    terms.insert(0, Term(f"logits ({rows}x{positions + 1}x{shape.vocab})", logits))
    if train:
        terms.insert(1, Term("logit gradients", logits * (2 * positions + 1) / (positions + 1)))
    return terms


def forward_terms(shape: ModelShape, rows: int, width: int, compute: str, placement: Placement) -> list[Term]:
    """A no-grad forward's own memory, without the logits: one layer's transients, the hidden states."""
    n, b = rows * width, _act_bytes(compute)
    terms = [Term(f"forward ({rows}x{width} tokens)", _layer_transient_elements(shape, width) * n * b
                  + 2 * shape.head_dim * n * 4)]
    gathered = _gathered_layer_bytes(shape, compute, placement)
    if gathered:
        terms.append(Term("FSDP gathered layers", gathered))
    return terms


def generation_terms(
    shape: ModelShape, rows: int, prompts: int, prompt_tokens: int, new_tokens: int, compute: str, storage: str,
    placement: Placement, lean: bool = True,
) -> list[Term]:
    """The transformers engine decoding `rows` rows of `prompts` distinct prompts at once
    (`rlhf.rollout.decode.sample`; `lean`: through the lean decoder, which copies weights)."""
    b = dtype_bytes(compute)
    columns = prompt_tokens + new_tokens
    kv_token = 2 * shape.layers * shape.kv * b
    prefill_cache = kv_token * prompts * prompt_tokens
    # the prompts' prefill (its forward's transients) comes before the decoding cache exists
    prefill = [Term(f"prompt prefill ({prompts}x{prompt_tokens} tokens)", prefill_cache
                    + _layer_transient_elements(shape, prompt_tokens) * prompts * prompt_tokens * b)]
    terms = [Term(f"KV cache ({rows} rows x {columns} tokens)", kv_token * rows * columns)]
    gathered = _gathered_layer_bytes(shape, compute, placement)
    if gathered:  # the prefill's forward; without the lean decoder every step's too
        prefill.append(Term("FSDP gathered layers", gathered))
    if not lean:  # the prefill's cache is expanded to the rows (and freed), then grows a column per step
        if gathered:
            terms.append(Term("FSDP gathered layers", gathered))
    else:
        terms.append(Term(f"prompt prefill's cache ({prompts}x{prompt_tokens} tokens, copied into the decoder's)",
                          prefill_cache))
        # the lean decoder reads every weight once (`rlhf.rollout.lean_decoder._full`), keeping what it
        # read until its fused q/k/v and gate/up copies are made: the layers' shards all-gathered (several
        # ranks) or cast to the compute dtype are new tensors; under FSDP the embedding and head are the
        # root group's gathered parameters, read in place
        layers = shape.layers * shape.layer_parameters
        if placement.fsdp and placement.world_size > 1 or compute != storage:
            outside = 0 if placement.fsdp else shape.parameters("lm") - layers
            kind = "gathered" if placement.fsdp and placement.world_size > 1 else "cast"
            terms.append(Term(f"decoder weights ({compute}, {kind})", b * (layers + outside)))
        terms.append(Term("decoder's fused q/k/v and gate/up weights", b * shape.fused_projection_parameters))
    terms.append(Term(f"sampling temporaries ({rows}x{shape.vocab} fp32)", 6 * rows * shape.vocab * 4))
    return largest(terms, prefill)


def _act_bytes(compute: str) -> float:
    """Bytes per activation element: the compute dtype, with RMSNorm's float32 internals under bf16."""
    return 4.0 if compute == "float32" else 2.6


def optimizer_step_terms(shape: ModelShape, head: str, placement: Placement) -> list[Term]:
    """AdamW's temporaries during `step`: on GPUs the foreach implementation makes one float32 copy of
    the (local) parameters; on CPUs the per-parameter loop, two of the largest (the embedding)."""
    if placement.cpu_offload:
        return []
    if placement.device == "cuda":
        return [Term("optimizer step temporaries", 4 * shape.parameters(head) / placement.shard)]
    return [Term("optimizer step temporaries", 2 * 4 * shape.vocab * shape.hidden / placement.shard)]


def shared_prefix_training_terms(
    shape: ModelShape, rows: int, prompts: int, prompt_tokens: int, response_tokens: int, compute: str,
) -> list[Term]:
    """Activations of a training micro-batch whose `prompts` distinct prompts are encoded once
    (`rlhf.models.shared_prefix`): the prompt pass over prompts x P tokens, the response pass over
    rows x R tokens attending to P + R keys (expanded to every head and saved by attention)."""
    b, p, r = _act_bytes(compute), prompt_tokens, response_tokens
    prefix = _layer_saved_elements(shape, p) * prompts * p
    keys = p + r
    suffix = (6 * shape.hidden + 4 * shape.intermediate + 2 * shape.q + shape.heads + 2 + keys) * rows * r \
        + 2 * shape.q * rows * keys
    return [
        Term(f"prompt pass activations ({shape.layers} layers x {prompts}x{p} tokens)", shape.layers * prefix * b),
        Term(f"response pass activations ({shape.layers} layers x {rows}x{r} tokens)", shape.layers * suffix * b),
        Term("final norm and rotary tables", ((2 * shape.hidden + 1) * rows * r * b
                                              + 2 * shape.head_dim * (prompts * p + rows * r) * 4)),
    ]


def shared_prefix_backward_terms(prompt_pass: Term, trained_parameters: int) -> list[Term]:
    """The end of a shared-prefix micro-batch's response pass backward: the prompt pass's activations
    (`prompt_pass`, from `shared_prefix_training_terms`) and the response pass's gradient of every trained
    weight (float32), which autograd holds in its input buffers until the prompt pass's backward reaches
    the same weight and adds its own (both passes run through the same parameters)."""
    return [prompt_pass, Term("response pass weight gradients (fp32), held until the prompt pass's are added",
                              4 * trained_parameters)]


def shared_prefix_forward_terms(
    shape: ModelShape, rows: int, prompts: int, prompt_tokens: int, response_tokens: int, compute: str,
) -> list[Term]:
    """A no-grad shared-prefix forward: the prompts' KV cache gathered to every row, one layer's transients."""
    b = dtype_bytes(compute)
    kv_token = 2 * shape.layers * shape.kv * b
    return [
        Term(f"prompt KV cache ({rows} rows x {prompt_tokens + response_tokens} tokens)",
             kv_token * rows * (prompt_tokens + response_tokens) + kv_token * prompts * prompt_tokens),
        Term(f"forward ({rows}x{response_tokens} tokens)",
             _layer_transient_elements(shape, prompt_tokens + response_tokens) * rows * response_tokens * b),
    ]


CUDA_WORKSPACE_BYTES = 64 * 2**20
"""What each process's CUDA math libraries take through torch's allocator once it multiplies matrices: the cuBLAS
and cuBLASLt workspaces, 32 MiB each on Hopper. Measured on an H100 (torch 2.11): every tiny-model phase peaked
~65 MiB above the sum of its tensors."""


def device_runtime_terms(placement: Placement) -> list[Term]:
    """Memory a process holds on its device beside its tensors (none on a CPU)."""
    return [Term("CUDA library workspaces (cuBLAS, cuBLASLt)", CUDA_WORKSPACE_BYTES)] if placement.device == "cuda" \
        else []


def estimate(role: str, phases: Iterable[tuple[str, Sequence[Term]]], host: Sequence[Term] = (),
             placement: Placement | None = None) -> MemoryEstimate:
    """The role's estimate; with `placement`, every phase also holds the device runtime's own memory."""
    extra = tuple(device_runtime_terms(placement)) if placement is not None else ()
    return MemoryEstimate(role, tuple(Phase(name, tuple(terms) + extra) for name, terms in phases), tuple(host))
