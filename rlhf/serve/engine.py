"""What the server needs from a rollout engine, and the HF engine behind that interface.

The server speaks token ids: it tokenises prompts itself (so it can check lengths before
queueing) and hands the engine a list of prompts that all share one `SamplingParams`. An
engine that takes per-request sampling settings natively (vLLM) would implement the same
`generate` and simply be handed bigger batches; only the HF engine exists today.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Protocol

import torch
from transformers import PreTrainedTokenizerBase

from rlhf.batch import Batch
from rlhf.data.tokenize import left_pad, position_ids
from rlhf.models.loading import load_causal_lm, load_tokenizer
from rlhf.rollout import HFEngine, SamplingParams


@dataclasses.dataclass(frozen=True)
class Generated:
    """One sampled response: its tokens (up to and including EOS, if it was sampled)."""

    token_ids: list[int]
    log_probs: list[float]  # the engine's log-prob of each token, at the sampling temperature
    hit_eos: bool  # the response ended on an EOS token (not cut by max_new_tokens)


class ServeEngine(Protocol):
    """A generation backend for `rlhf serve`. Called from one worker thread at a time."""

    tokenizer: PreTrainedTokenizerBase
    max_model_len: int  # prompt + response tokens the model accepts

    def generate(
        self, prompts: Sequence[Sequence[int]], sampling: SamplingParams, seed: int | None = None
    ) -> list[Generated]:
        """One response per prompt (`sampling.n` is 1: the caller repeats prompts itself)."""
        ...


class HFServeEngine:
    """`HFEngine` (transformers' `generate`, the CPU rollout engine) behind `ServeEngine`."""

    def __init__(self, engine: HFEngine, max_model_len: int):
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.max_model_len = max_model_len

    @classmethod
    def from_pretrained(cls, name_or_path: str, dtype: str = "float32") -> HFServeEngine:
        """Load a model folder (a trainer's checkpoint folder is one) with its tokenizer."""
        model = load_causal_lm(name_or_path, dtype=dtype).eval()
        max_len = getattr(model.config, "max_position_embeddings", None) or 2048
        return cls(HFEngine(model, load_tokenizer(name_or_path)), max_model_len=int(max_len))

    def generate(
        self, prompts: Sequence[Sequence[int]], sampling: SamplingParams, seed: int | None = None
    ) -> list[Generated]:
        ids, mask = left_pad(prompts, self.engine.pad_token_id)
        batch = Batch({"input_ids": ids, "attention_mask": mask, "position_ids": position_ids(mask)})
        if seed is None:
            out = self.engine.generate(batch, sampling)
        else:  # a private RNG stream: the same seed gives the same sample whatever ran before
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                out = self.engine.generate(batch, sampling)
        lengths = out["response_mask"].sum(dim=1).tolist()
        eos = set(self.engine.eos_token_ids)
        results = []
        for row, length in enumerate(lengths):
            tokens = out["responses"][row, :length].tolist()
            log_probs = out["rollout_log_probs"][row, :length].tolist()
            results.append(Generated(tokens, log_probs, hit_eos=bool(tokens) and tokens[-1] in eos))
        return results
