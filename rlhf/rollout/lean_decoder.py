"""Decode steps for Llama-family models (Qwen2, Llama, Mistral) without transformers' per-call machinery.

A decoding step of a small model is mostly overhead, not arithmetic: each call of a Hugging
Face model builds an attention mask, runs output-capturing decorators, recomputes the rotary
table, grows the KV cache with `torch.cat` and dispatches attention through SDPA, whose CPU
kernel is slower than two matmuls at one query token. `LeanDecoder` runs the same layers
from the model's parameters as they are when the rollout starts (the hybrid engine updates
them between rollouts, never during one) with what a step needs only:
- a preallocated KV cache written in place: each prompt's keys and values once for its n samples
  (cascade attention: the n samples' queries meet the shared prompt in one matmul), each row's
  decoded tokens on their own; sequences enter (`add`, with their prefill) and leave (`select`)
  as decoding goes;
- the q/k/v projections as one matmul, and the MLP's gate and up projections as one (their
  weights concatenated once per rollout);
- the rotary table of every position computed once per rollout;
- the padding bias kept per row, each new column unmasked as it is written;
- grouped-query attention as two batched matmuls with the query heads grouped per KV head (no
  `repeat_kv` copy).
Prompt prefills still run through the model's own forward (one call per group of prompts admitted).
Tests (tests/rollout/test_lean_decoder.py) check the step logits against the model's forward.
A model is recognised by its config and module tree (`supports`), not its class name, so a
module sharded by FSDP2's `fully_shard` (class `FSDPQwen2ForCausalLM`) keeps the lean step:
its weights are gathered once per rollout and the steps run no collective, so ranks whose
rows finish at different steps cannot deadlock in a decoding step.
Other architectures, adapters (PEFT), modules with forward hooks, sliding windows shorter
than the sequence and sequence-length-dependent rotary scalings fall back to the model's
forward.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from transformers import DynamicCache

SUPPORTED_MODEL_TYPES = frozenset({"qwen2", "llama", "mistral"})  # `config.model_type` of the layers below
_STATIC_ROPE = {"default", "linear", "llama3", "yarn"}  # the table does not depend on the sequence length
HEAD_CHUNK = 1024
"""Vocabulary entries per matmul of the LM head in a decoding step on a CPU. One (rows x V) product at
SmolLM2's 49,152 entries writes a 12.6 MB output at 64 rows, past this CPU's L2; in chunks of 1024 each
block stays in L2 while it is written and copied out: 57 -> 70 GFLOP/s on the head at 64 rows (34 -> 43
at 16; one thread, Zen 3), with the same bits (each logit is the same dot product). On an accelerator
it stays one matmul (48 launches instead of one would cost more)."""
_PROJECTIONS = (("self_attn", "q_proj"), ("self_attn", "k_proj"), ("self_attn", "v_proj"), ("self_attn", "o_proj"),
                ("mlp", "gate_proj"), ("mlp", "up_proj"), ("mlp", "down_proj"))


def _fsdp_hook(hook: object, module: torch.nn.Module) -> bool:
    """True for the (un)shard hooks FSDP2's `fully_shard` registers on `module`: the lean step gathers
    the weights itself (`_full`), so skipping those hooks changes nothing."""
    if not torch.distributed.is_available():
        return False
    from torch.distributed.fsdp import FSDPModule, fully_shard

    return isinstance(module, FSDPModule) and getattr(hook, "__self__", None) is fully_shard.state(module)


def _hooked(module: torch.nn.Module) -> bool:
    """A forward hook, pre-hook or Accelerate hook (device maps, offload) that the lean step would skip."""
    hooks = [*module._forward_hooks.values(), *module._forward_pre_hooks.values()]
    return hasattr(module, "_hf_hook") or any(not _fsdp_hook(h, module) for h in hooks)


def _window_too_short(cfg: object, length: int | None) -> bool:
    """True when some layer attends through a sliding window that could cut a sequence of `length` tokens.

    A window of w keeps the w most recent keys (the query included), so a sequence no longer than w
    sees every key: full attention. Unknown length: any window counts.
    """
    window = getattr(cfg, "sliding_window", None)
    layer_types = getattr(cfg, "layer_types", None) or []
    sliding = any(t != "full_attention" for t in layer_types) or (
        window is not None and getattr(cfg, "model_type", None) == "mistral"  # Mistral windows every layer
    )
    return sliding and (window is None or length is None or length > window)


def _architecture(model: torch.nn.Module) -> bool:
    """The module tree the lean step reads: plain `nn.Linear` projections, `nn.Embedding`, RMSNorms, a rotary table.

    Adapters (PEFT's LoRA layers replace the Linear projections and wrap the model so this tree is
    not where it is looked for) and other replaced modules fail here.
    """
    body = getattr(model, "model", None)
    layers = getattr(body, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList) or len(layers) != getattr(model.config, "num_hidden_layers", -1):
        return False
    if type(getattr(body, "embed_tokens", None)) is not torch.nn.Embedding:
        return False
    if type(getattr(model, "lm_head", None)) is not torch.nn.Linear or not hasattr(body, "rotary_emb"):
        return False
    norms = [body.norm] + [getattr(layer, name, None) for layer in layers
                           for name in ("input_layernorm", "post_attention_layernorm")]
    if not all(hasattr(m, "weight") and hasattr(m, "variance_epsilon") for m in norms):
        return False
    return all(
        type(getattr(getattr(layer, part, None), name, None)) is torch.nn.Linear
        for layer in layers
        for part, name in _PROJECTIONS
    )


def supports(model: torch.nn.Module, length: int | None = None) -> bool:
    """True when `model` is a Llama-family causal LM this decoder reproduces exactly.

    Recognised by its config (`model_type` qwen2, llama or mistral) and its module tree, not by
    its class: FSDP2's `fully_shard` swaps the class (`Qwen2ForCausalLM` -> `FSDPQwen2ForCausalLM`)
    and registers (un)shard hooks, and such a module is still supported (the step gathers the
    sharded weights once per rollout). `length` (prompt + new tokens) lets a sliding window longer
    than the sequence count as full attention. Falls back (False) for other architectures, adapters,
    forward hooks, sliding windows that could bind, sequence-length-dependent rotary scalings and
    tensor-parallel pretraining splits.
    """
    cfg = getattr(model, "config", None)
    if getattr(cfg, "model_type", None) not in SUPPORTED_MODEL_TYPES or not _architecture(model):
        return False
    rope = getattr(model.model.rotary_emb, "rope_type", "default")
    return (
        rope in _STATIC_ROPE
        and not _window_too_short(cfg, length)
        and getattr(cfg, "pretraining_tp", 1) == 1
        and not any(_hooked(m) for m in model.modules())  # the step calls no module's forward
    )


def _full(p: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """A parameter as one plain tensor in the compute dtype: an FSDP2 shard (DTensor) is gathered
    (a collective: every rank builds its decoder at the same point, in the same parameter order)."""
    if p is None:
        return None
    if torch.distributed.is_available():
        from torch.distributed.tensor import DTensor

        if isinstance(p, DTensor):
            p = p.full_tensor()
    return p.detach().to(dtype)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' Llama/Qwen2 RMSNorm: in float32, scaled by the weight in the input dtype."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class _Layer(NamedTuple):
    """One decoder layer's weights as plain tensors in the compute dtype (biases may be None)."""

    norm1: torch.Tensor
    eps1: float
    w_qkv: torch.Tensor  # q, k and v projections concatenated: one matmul
    b_qkv: torch.Tensor | None
    w_o: torch.Tensor
    b_o: torch.Tensor | None
    norm2: torch.Tensor
    eps2: float
    w_gate_up: torch.Tensor  # gate and up projections concatenated: one matmul
    b_gate_up: torch.Tensor | None
    w_down: torch.Tensor
    b_down: torch.Tensor | None
    act: object


class _StepView(NamedTuple):
    """What every layer's attention reads in one step: the prompt store's groups and columns in use, the decoded
    columns any row attends to, each row's prompt group and sample in it, and the (B, 1, 1, width + length)
    bias masking the prompts' left padding and each row's unwritten columns."""

    groups: int
    width: int
    length: int
    slot: torch.Tensor
    member: torch.Tensor
    bias: torch.Tensor


class LeanDecoder:
    """One-token decoding steps for up to `rows` sequences, each with its own place in a preallocated KV cache.

    The n samples of a prompt share its prompt, so its keys and values are kept once (cascade
    attention): a prompt store (groups, kv_heads, prompt_columns, D) per layer holds each admitted
    prompt group's prefill, and a row store (rows, kv_heads, new_columns, D) each sequence's decoded
    tokens. A step attends to both under one softmax: the prompt part as one matmul per group and
    KV head over all n samples' query heads (n x group rows against the prompt's keys, read once
    instead of n times), the decoded part per row. Decoding attention reads the KV cache, not
    weights, so at SmolLM2's 64 rows it was 11-16% of a step; the prompt is most of what it reads
    (a reasoning-gym prompt of ~150 tokens against 8-64 decoded ones).
    A sequence enters with its prompt's prefill (`add`) and leaves at any step (`select`), so a
    finished row stops costing compute and its slot can take a new prompt (continuous batching,
    rlhf.rollout.decode); a prompt group's slot is freed with its last row. The active sequences
    are the first `self.rows` rows of the row store. Each row has its own write column and rotary
    position; attention reads the decoded columns up to the furthest row's, each row's unwritten
    columns and its prompt's left padding masked out. Rows admitted together (one `add`) share
    their write column, so a batch that is never refilled computes exactly what one static batch
    would. The weights are read once, here: plain tensors, FSDP2 shards gathered (a collective:
    every rank builds its decoder at the same point), cast to `dtype`, the dtype the model's own
    forward computed the prefill in.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        rows: int,  # sequences decoding at once, at most
        n: int,  # samples per prompt: rows enter in groups of n sharing one prompt
        prompt_columns: int,  # a prompt's (left-padded) prefill length, at most
        new_columns: int,  # decoded tokens per sequence fed back through the step, at most
        dtype: torch.dtype,
        device: torch.device,
        min_rows: int = 1,  # matmuls run on at least this many rows (zero rows added), see rlhf.rollout.decode
    ):
        cfg = model.config
        body = model.model
        self.heads = cfg.num_attention_heads
        self.kv_heads = getattr(cfg, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads
        self.group = self.heads // self.kv_heads
        self.scale = body.layers[0].self_attn.scaling
        self.capacity, self.n, self.min_rows = rows, n, min_rows
        self.prompt_columns, self.new_columns = prompt_columns, new_columns
        groups = rows  # prompt groups at once: with refill, as many as rows (one survivor each), not rows / n
        # zeros, not empty: a reused slot's stale columns are masked, and masked values must be finite
        self.prompt_keys = [torch.zeros((groups, self.kv_heads, prompt_columns, self.head_dim), dtype=dtype,
                                        device=device) for _ in body.layers]
        self.prompt_values = [torch.zeros_like(k) for k in self.prompt_keys]
        self.prompt_bias = torch.full((groups, 1, 1, prompt_columns), float("-inf"), dtype=torch.float32, device=device)
        self.keys = [torch.zeros((rows, self.kv_heads, new_columns, self.head_dim), dtype=dtype, device=device)
                     for _ in body.layers]
        self.values = [torch.zeros_like(k) for k in self.keys]
        self.bias = torch.full((rows, 1, 1, new_columns), float("-inf"), dtype=torch.float32, device=device)
        # each group's n samples' queries, and their attention to the prompt, laid out by (group, sample)
        self._grouped_q = torch.zeros((groups, n, self.kv_heads, self.group, self.head_dim), dtype=dtype, device=device)
        self._grouped_p = torch.zeros((groups, self.kv_heads, n, self.group, prompt_columns), dtype=dtype, device=device)
        self.column = torch.zeros(rows, dtype=torch.long, device=device)  # where each row's next key goes
        self.position = torch.zeros(rows, dtype=torch.long, device=device)  # each row's next rotary position
        self.slot = torch.zeros(rows, dtype=torch.long, device=device)  # each row's prompt group
        self.member = torch.zeros(rows, dtype=torch.long, device=device)  # ... and its sample in the group
        self.index = torch.arange(rows, device=device)
        positions = torch.arange(prompt_columns + new_columns, device=device)[None]
        cos, sin = body.rotary_emb(self.keys[0][:1], positions)  # (1, columns, D)
        self.cos, self.sin = cos[0], sin[0]  # looked up by position (a position is never beyond its column)
        self.rows = 0  # active rows: the first `rows` of the row store
        self.steps = 0  # steps taken; a row's write column is its base + steps (host-side, no device reads)
        self._base: list[int] = []
        self._slots: list[int] = []  # each active row's prompt group (host-side)
        self._width: dict[int, int] = {}  # each used prompt group's prefill length
        gathered: dict[int, torch.Tensor | None] = {}  # tied weights are gathered once

        def full(p: torch.Tensor | None) -> torch.Tensor | None:
            if id(p) not in gathered:
                gathered[id(p)] = _full(p, dtype)
            return gathered[id(p)]

        self.layers = [self._read(layer, full) for layer in body.layers]
        self.embed = full(body.embed_tokens.weight)
        self.norm, self.eps = full(body.norm.weight), body.norm.variance_epsilon
        self.w_head, self.b_head = full(model.lm_head.weight), full(model.lm_head.bias)

    @staticmethod
    def _read(layer: torch.nn.Module, full) -> _Layer:
        """A layer's weights; q/k/v and gate/up concatenated (one matmul each instead of three and two)."""
        attn, mlp = layer.self_attn, layer.mlp

        def cat(mods: tuple, attr: str) -> torch.Tensor | None:
            parts = [full(getattr(m, attr)) for m in mods]
            if all(p is None for p in parts):
                return None
            ref = next(p for p in parts if p is not None)
            return torch.cat([p if p is not None else ref.new_zeros(m.out_features) for p, m in zip(parts, mods)])

        qkv = (attn.q_proj, attn.k_proj, attn.v_proj)
        gate_up = (mlp.gate_proj, mlp.up_proj)
        return _Layer(
            norm1=full(layer.input_layernorm.weight), eps1=layer.input_layernorm.variance_epsilon,
            w_qkv=cat(qkv, "weight"), b_qkv=cat(qkv, "bias"),
            w_o=full(attn.o_proj.weight), b_o=full(attn.o_proj.bias),
            norm2=full(layer.post_attention_layernorm.weight), eps2=layer.post_attention_layernorm.variance_epsilon,
            w_gate_up=cat(gate_up, "weight"), b_gate_up=cat(gate_up, "bias"),
            w_down=full(mlp.down_proj.weight), b_down=full(mlp.down_proj.bias), act=mlp.act_fn,
        )

    @property
    def free(self) -> int:
        """Rows that can still be added."""
        return self.capacity - self.rows

    def add(self, prefill_cache: DynamicCache, attention_mask: torch.Tensor, n: int) -> None:
        """Append the n samples of each of U prefilled prompts as rows (the samples of a prompt adjacent).

        prefill_cache: (U, kv_heads, P, D) per layer, from the model's forward over the prompts;
        attention_mask: (U, P) 1 on prompt tokens (left padding 0). Each prompt takes a free group
        slot of the prompt store; its samples' first decoded tokens go to their rows' column 0, at
        rotary position (prompt length).
        """
        u, p = attention_mask.shape
        lo, hi = self.rows, self.rows + u * n
        used = set(self._slots)
        free = [g for g in range(self.prompt_bias.shape[0]) if g not in used][:u]
        if n != self.n or hi > self.capacity or p > self.prompt_columns or len(free) < u:
            raise ValueError(f"LeanDecoder.add: {u} prompts of {p} columns x {n} samples do not fit ({self.free} "
                             f"rows free, {self.prompt_columns} prompt columns, {self.n} samples per prompt)")
        slots = torch.tensor(free, dtype=torch.long, device=self.slot.device)
        for layer, keys, values in zip(prefill_cache.layers, self.prompt_keys, self.prompt_values):
            keys[slots, :, :p] = layer.keys.to(keys.dtype)  # under autocast, keys (rotated) and values may differ
            values[slots, :, :p] = layer.values.to(values.dtype)
        bias = torch.full((u, 1, 1, self.prompt_columns), float("-inf"), dtype=torch.float32, device=slots.device)
        bias[:, 0, 0, :p].masked_fill_(attention_mask.bool(), 0.0)
        self.prompt_bias[slots] = bias
        self.bias[lo:hi] = float("-inf")  # a reused slot: its old row's columns are masked again
        self.column[lo:hi] = 0
        self.position[lo:hi] = attention_mask.sum(dim=1).repeat_interleave(n)
        self.slot[lo:hi] = slots.repeat_interleave(n)
        self.member[lo:hi] = torch.arange(n, device=slots.device).repeat(u)
        self.rows = hi
        self._base.extend([-self.steps] * (hi - lo))
        self._slots.extend(g for g in free for _ in range(n))
        self._width.update((g, p) for g in free)

    def select(self, keep: list[int]) -> None:
        """Keep the rows `keep` (indices of active rows, in their new order), drop the others.

        Only rows whose place changes are copied (the columns written so far), so dropping rows
        with swap-remove order (the survivors that stay where they are, the last survivors moved
        into the holes: see rlhf.rollout.decode) copies at most as many rows as were dropped. A
        prompt group whose last row leaves frees its slot in the prompt store.
        """
        moves = [(dst, src) for dst, src in enumerate(keep) if dst != src]
        if moves:
            dst = torch.tensor([d for d, _ in moves], device=self.column.device)
            src = torch.tensor([s for _, s in moves], device=self.column.device)
            used = max(self._base) + self.steps  # the furthest column written so far
            for buffer in (*self.keys, *self.values):
                buffer[dst, :, :used] = buffer[src, :, :used]
            for state in (self.bias, self.column, self.position, self.slot, self.member):
                state[dst] = state[src]
        self._base = [self._base[i] for i in keep]
        self._slots = [self._slots[i] for i in keep]
        used = set(self._slots)
        self._width = {g: w for g, w in self._width.items() if g in used}
        self.rows = len(keep)

    @torch.no_grad()
    def step(self, token: torch.Tensor) -> torch.Tensor:
        """Logits (B, V) after feeding `token` (B,) to the B active rows. No host sync."""
        b = token.shape[0]
        if b != self.rows:
            raise ValueError(f"LeanDecoder.step: {b} tokens for {self.rows} active rows")
        furthest = max(self._base)
        length = furthest + self.steps + 1  # decoded columns any row attends to, its own new one included
        if furthest == min(self._base):  # one column for every row (rows admitted together): plain slices
            rows, column = slice(0, b), furthest + self.steps
        else:
            rows, column = self.index[:b], self.column[:b]
        self.bias[rows, 0, 0, column] = 0.0  # each row's new column becomes visible to that row
        groups, width = max(self._slots) + 1, max(self._width.values())  # the prompt store's part in use
        slot, member = self.slot[:b], self.member[:b]
        view = _StepView(groups, width, length, slot, member,
                         torch.cat([self.prompt_bias[slot][..., :width], self.bias[:b, ..., :length]], dim=-1))
        x = F.embedding(token, self.embed)  # (B, hidden)
        position = self.position[:b]
        cos, sin = self.cos[position][:, None, :], self.sin[position][:, None, :]  # (B, 1, D)
        hq, hk = self.heads * self.head_dim, self.kv_heads * self.head_dim
        linear = self._linear
        for w, keys, values, prompt_keys, prompt_values in zip(self.layers, self.keys, self.values, self.prompt_keys,
                                                               self.prompt_values):
            qkv = linear(_rms_norm(x, w.norm1, w.eps1), w.w_qkv, w.b_qkv)
            qk = _rotate(qkv[:, : hq + hk].view(b, self.heads + self.kv_heads, self.head_dim), cos, sin)
            # (under autocast the matmuls may compute in another dtype than the cache's, as a slice assignment allows)
            keys[rows, :, column] = qk[:, self.heads :].to(keys.dtype)
            values[rows, :, column] = qkv[:, hq + hk :].view(b, self.kv_heads, self.head_dim).to(values.dtype)
            q = qk[:, : self.heads].reshape(b, self.kv_heads, self.group, self.head_dim)
            out = self._attend(view, q, keys, values, prompt_keys, prompt_values)
            x = x + linear(out.reshape(b, hq), w.w_o, w.b_o)
            gate, up = linear(_rms_norm(x, w.norm2, w.eps2), w.w_gate_up, w.b_gate_up).chunk(2, dim=-1)
            x = x + linear(w.act(gate) * up, w.w_down, w.b_down)
        self.column[:b] += 1
        self.position[:b] += 1
        self.steps += 1
        return self._head(_rms_norm(x, self.norm, self.eps))

    def _attend(self, view: _StepView, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                prompt_keys: torch.Tensor, prompt_values: torch.Tensor) -> torch.Tensor:
        """One layer's attention output (B, kv_heads, group, D) for the queries q (B, kv_heads, group, D) of the B
        active rows (this step's keys and values already written): the prompt part per group of n samples, the
        decoded part per row, under one softmax (cascade attention, the class docstring)."""
        b, groups, width, length, slot, member = q.shape[0], view.groups, view.width, view.length, view.slot, view.member
        shape = (groups, self.kv_heads, self.n * self.group)
        grouped_q, grouped_p = self._grouped_q[:groups], self._grouped_p[:groups, ..., :width]
        grouped_q[slot, member] = q.to(grouped_q.dtype)
        on_prompt = torch.matmul(grouped_q.transpose(1, 2).reshape(*shape, self.head_dim),
                                 prompt_keys[:groups, :, :width].transpose(-1, -2))
        on_prompt = on_prompt.view(groups, self.kv_heads, self.n, self.group, width)[slot, :, member]
        on_decoded = torch.matmul(q, keys[:b, :, :length].transpose(-1, -2))
        scores = torch.cat([on_prompt, on_decoded], dim=-1) * self.scale + view.bias
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        grouped_p[slot, :, member] = probs[..., :width].to(grouped_p.dtype)
        from_prompt = torch.matmul(grouped_p.reshape(*shape, width), prompt_values[:groups, :, :width])
        out = torch.matmul(probs[..., width:], values[:b, :, :length])
        return out + from_prompt.view(groups, self.kv_heads, self.n, self.group, self.head_dim)[slot, :, member]

    def _head(self, x: torch.Tensor) -> torch.Tensor:
        """Logits (B, V) of the LM head, in vocabulary chunks of HEAD_CHUNK on a CPU (see there)."""
        vocab = self.w_head.shape[0]
        if x.device.type != "cpu" or vocab <= HEAD_CHUNK:
            return self._linear(x, self.w_head, self.b_head)
        m = x.shape[0]
        padded = x if m >= self.min_rows else F.pad(x, (0, 0, 0, self.min_rows - m))
        logits = x.new_empty((m, vocab))
        for lo in range(0, vocab, HEAD_CHUNK):
            bias = None if self.b_head is None else self.b_head[lo : lo + HEAD_CHUNK]
            logits[:, lo : lo + HEAD_CHUNK] = F.linear(padded, self.w_head[lo : lo + HEAD_CHUNK], bias)[:m]
        return logits

    def _linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """F.linear over at least `min_rows` rows: fewer are padded with zero rows, whose outputs are dropped."""
        m = x.shape[0]
        if m >= self.min_rows:
            return F.linear(x, weight, bias)
        return F.linear(F.pad(x, (0, 0, 0, self.min_rows - m)), weight, bias)[:m]
