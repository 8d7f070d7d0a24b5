"""Model FLOPs of a step's phases and one thread's measured matmul peak: utilisation = FLOPs / (seconds x peak).

Counted is the useful work only (what the model must compute, not what an implementation does on top): 2 x
parameters per token through the layers, the LM head where logits are needed, causal attention (scores and
values, 4 x layers x width per query-key pair), and a backward pass twice its forward. Used by
`grpo_vs_trl.py --model` (the per-phase utilisation table) and `decoder_vs_transformers.py`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch


def matmul_peak(seconds: float = 2.0, size: int = 1024) -> float:
    """GFLOP/s of square fp32 matmuls on this thread, over CPU time (the best of several bursts)."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    best, spent = 0.0, 0.0
    while spent < seconds:
        start = time.process_time()
        for _ in range(4):
            torch.mm(a, b)
        took = time.process_time() - start
        spent += took
        best = max(best, 4 * 2 * size**3 / took / 1e9)
    return best


@dataclass(frozen=True)
class Shape:
    """What the FLOP count needs of a decoder-only transformer's config."""

    layers: int
    hidden: int
    attention_width: int  # query heads x head dim
    kv_width: int  # key/value heads x head dim
    intermediate: int
    vocab: int

    @classmethod
    def of(cls, cfg) -> Shape:
        """From a transformers config (Qwen2, Llama and alike)."""
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        return cls(cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads * head_dim,
                   cfg.num_key_value_heads * head_dim, cfg.intermediate_size, cfg.vocab_size)

    @property
    def body(self) -> int:
        """Parameters in the layers' matmuls (q, k, v, o; gate, up, down)."""
        h = self.hidden
        return self.layers * (h * (self.attention_width + 2 * self.kv_width) + self.attention_width * h
                              + 3 * h * self.intermediate)

    @property
    def head(self) -> int:
        return self.vocab * self.hidden

    def attention(self, queries: int, keys_before: int = 0) -> float:
        """Causal attention FLOPs of `queries` consecutive tokens after `keys_before` cached ones."""
        pairs = queries * keys_before + queries * (queries + 1) / 2
        return 4 * self.layers * self.attention_width * pairs


def rollout_flops(shape: Shape, prompt_lengths: list[int], n: int, response_lengths: list[int]) -> float:
    """A rollout's useful work: each distinct prompt prefilled once (LM head on its last token only), then one
    decode step per response token after the first (the first comes from the prefill's logits); response i
    answers prompt i // n."""
    flops = 0.0
    for p in prompt_lengths:
        flops += 2 * shape.body * p + 2 * shape.head + shape.attention(p)
    for i, r in enumerate(response_lengths):
        p = prompt_lengths[i // n]
        for t in range(1, r):  # the step feeding token t attends to p + t + 1 keys
            flops += 2 * shape.body + 2 * shape.head + 4 * shape.layers * shape.attention_width * (p + t + 1)
    return flops


def forward_flops(shape: Shape, prompt_length: int, response_length: int, rows: int, n: int = 1) -> float:
    """One teacher-forced forward of `rows` (prompt + response) sequences, logits on the response tokens only
    (log-probs of the response). Each group of `n` rows shares its prompt, and the useful work encodes a
    prompt once per group (what `shared_prefix` does; an implementation that encodes it per row does more
    work than is counted)."""
    prompt = (rows // n) * (2 * shape.body * prompt_length + shape.attention(prompt_length))
    response = rows * (2 * shape.body * response_length + 2 * shape.head * response_length
                       + shape.attention(response_length, keys_before=prompt_length))
    return prompt + response


def update_flops(shape: Shape, prompt_length: int, response_length: int, rows: int, n: int = 1) -> float:
    """Forward and backward of the same sequences: the backward is twice the forward."""
    return 3 * forward_flops(shape, prompt_length, response_length, rows, n)
