"""Decode steps for Llama-family models (Qwen2, Llama, Mistral) without transformers' per-call machinery.

A decoding step of a small model is mostly overhead, not arithmetic: each call of a Hugging
Face model builds an attention mask, runs output-capturing decorators, recomputes the rotary
table, grows the KV cache with `torch.cat` and dispatches attention through SDPA, whose CPU
kernel is slower than two matmuls at one query token. `LeanDecoder` runs the same layers
from the model's parameters as they are when the rollout starts (the hybrid engine updates
them between rollouts, never during one) with what a step needs only:
- a preallocated KV cache (B, kv_heads, P + max_new_tokens, D) written in place;
- the q/k/v projections as one matmul, and the MLP's gate and up projections as one (their
  weights concatenated once per rollout);
- the rotary table of every future position computed once per rollout;
- the padding bias computed once; grouped-query attention as two batched matmuls with the
  query heads grouped per KV head (no `repeat_kv` copy).
The prompt prefill still runs through the model's own forward (one call per rollout).
Tests (tests/rollout/test_lean_decoder.py) check the step logits against the model's forward.
Other architectures, adapters (PEFT), modules with forward hooks, sliding windows and
sequence-length-dependent rotary scalings fall back to the model's forward (`supports`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import DynamicCache

SUPPORTED = {"Qwen2ForCausalLM", "LlamaForCausalLM", "MistralForCausalLM"}
_STATIC_ROPE = {"default", "linear", "llama3", "yarn"}  # the table does not depend on the sequence length


def supports(model: torch.nn.Module) -> bool:
    """True when `model` is an unwrapped Llama-family causal LM this decoder reproduces exactly."""
    if type(model).__name__ not in SUPPORTED:
        return False
    cfg = model.config
    rope = getattr(model.model.rotary_emb, "rope_type", "default")
    layer_types = getattr(cfg, "layer_types", None) or ["full_attention"]
    plain = all(
        type(m) is torch.nn.Linear
        for layer in model.model.layers
        for m in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj, layer.self_attn.o_proj,
                  layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj)
    )
    hooked = any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())  # the step calls no module
    return (
        plain
        and not hooked
        and rope in _STATIC_ROPE
        and all(t == "full_attention" for t in layer_types)
        and getattr(cfg, "pretraining_tp", 1) == 1
        and type(model.lm_head) is torch.nn.Linear
    )


def _rms_norm(x: torch.Tensor, norm: torch.nn.Module) -> torch.Tensor:
    """transformers' Llama/Qwen2 RMSNorm: in float32, scaled by the weight in the input dtype."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
    return norm.weight * h.to(x.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class LeanDecoder:
    """One-token decoding steps over a preallocated KV cache, filled from a prefill's DynamicCache."""

    def __init__(
        self,
        model: torch.nn.Module,
        prefill_cache: DynamicCache,  # (U, kv_heads, P, D) per layer, from the prompt pass
        n: int,  # rows per prompt: the cache is repeated n times (rows of a prompt adjacent)
        attention_mask: torch.Tensor,  # (B, P + max_new_tokens): 1 on real tokens and every decoded position
        first_positions: torch.Tensor,  # (B, 1): rotary position of the first decoded token
        max_new_tokens: int,
    ):
        self.model = model
        cfg = model.config
        self.layers = list(model.model.layers)
        self.heads = cfg.num_attention_heads
        self.kv_heads = getattr(cfg, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads
        self.scale = self.layers[0].self_attn.scaling
        b, total = attention_mask.shape
        self.prompt_len = total - max_new_tokens
        ref = model.lm_head.weight
        self.keys, self.values = [], []
        for layer in prefill_cache.layers[: len(self.layers)]:
            k = torch.empty((b, self.kv_heads, total, self.head_dim), dtype=layer.keys.dtype, device=ref.device)
            v = torch.empty_like(k)
            k[:, :, : self.prompt_len] = layer.keys.repeat_interleave(n, dim=0) if n > 1 else layer.keys
            v[:, :, : self.prompt_len] = layer.values.repeat_interleave(n, dim=0) if n > 1 else layer.values
            self.keys.append(k)
            self.values.append(v)
        bias = torch.zeros((b, 1, 1, total), dtype=torch.float32, device=ref.device)
        self.bias = bias.masked_fill_(attention_mask[:, None, None, :] == 0, float("-inf"))
        positions = first_positions + torch.arange(max_new_tokens, device=ref.device)  # (B, max_new)
        cos, sin = model.model.rotary_emb(self.keys[0], positions)  # (B, max_new, D)
        self.cos, self.sin = cos[:, :, None, :], sin[:, :, None, :]  # broadcast over heads
        self.fused = [self._fuse(layer) for layer in self.layers]

    @staticmethod
    def _fuse(layer: torch.nn.Module) -> tuple:
        """(qkv weight, qkv bias, gate|up weight, gate|up bias): one matmul each instead of three and two."""
        attn, mlp = layer.self_attn, layer.mlp

        def cat(mods, attr):
            parts = [getattr(m, attr) for m in mods]
            if all(p is None for p in parts):
                return None
            return torch.cat([p if p is not None else torch.zeros(m.out_features, dtype=parts[0].dtype,
                                                                  device=m.weight.device)
                              for p, m in zip(parts, mods)]).detach()

        qkv = (attn.q_proj, attn.k_proj, attn.v_proj)
        gate_up = (mlp.gate_proj, mlp.up_proj)
        return cat(qkv, "weight"), cat(qkv, "bias"), cat(gate_up, "weight"), cat(gate_up, "bias")

    @torch.no_grad()
    def step(self, token: torch.Tensor, t: int) -> torch.Tensor:
        """Logits (B, V) after feeding `token` (B,) as decoded token t (0-based)."""
        b = token.shape[0]
        slot = self.prompt_len + t
        length = slot + 1
        x = self.model.model.embed_tokens(token)  # (B, hidden)
        cos, sin = self.cos[:, t], self.sin[:, t]  # (B, 1, D)
        group = self.heads // self.kv_heads
        hq, hk = self.heads * self.head_dim, self.kv_heads * self.head_dim
        for layer, keys, values, (w_qkv, b_qkv, w_gu, b_gu) in zip(self.layers, self.keys, self.values, self.fused):
            attn, mlp = layer.self_attn, layer.mlp
            qkv = F.linear(_rms_norm(x, layer.input_layernorm), w_qkv, b_qkv)
            qk = _rotate(qkv[:, : hq + hk].view(b, self.heads + self.kv_heads, self.head_dim), cos, sin)
            keys[:, :, slot] = qk[:, self.heads :]
            values[:, :, slot] = qkv[:, hq + hk :].view(b, self.kv_heads, self.head_dim)
            q = qk[:, : self.heads].reshape(b, self.kv_heads, group, self.head_dim)
            scores = torch.matmul(q, keys[:, :, :length].transpose(-1, -2)) * self.scale + self.bias[..., :length]
            probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
            out = torch.matmul(probs, values[:, :, :length]).reshape(b, hq)
            x = x + F.linear(out, attn.o_proj.weight, attn.o_proj.bias)
            gate, up = F.linear(_rms_norm(x, layer.post_attention_layernorm), w_gu, b_gu).chunk(2, dim=-1)
            x = x + F.linear(mlp.act_fn(gate) * up, mlp.down_proj.weight, mlp.down_proj.bias)
        x = _rms_norm(x, self.model.model.norm)
        return F.linear(x, self.model.lm_head.weight, self.model.lm_head.bias)
