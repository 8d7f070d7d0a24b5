"""From sampled token ids to what a client sees: text, stop strings, finish reason, stream pieces.

The server speaks token ids: it tokenises prompts itself (so it can check lengths before
queueing) and hands any rollout engine (rlhf.rollout.engine.RolloutEngine) a list of prompts
that share one `SamplingParams` through `generate_rows`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from transformers import PreTrainedTokenizerBase

from rlhf.batch import Batch
from rlhf.data.tokenize import left_pad, position_ids
from rlhf.rollout.engine import RolloutEngine
from rlhf.rollout.sampling import SamplingParams


@dataclasses.dataclass(frozen=True)
class Generated:
    """One sampled response: its tokens (up to and including EOS, if it was sampled)."""

    token_ids: list[int]
    log_probs: list[float]  # the engine's log-prob of each token, at the sampling temperature
    hit_eos: bool  # the response ended on an EOS token (not cut by max_new_tokens)


def generate_rows(
    engine: RolloutEngine, prompts: Sequence[Sequence[int]], sampling: SamplingParams, seed: int | None = None
) -> list[Generated]:
    """One response per prompt (`sampling.n` is 1: the caller repeats prompts itself)."""
    ids, mask = left_pad(prompts, engine.pad_token_id)
    batch = Batch({"input_ids": ids, "attention_mask": mask, "position_ids": position_ids(mask)})
    out = engine.generate(batch, sampling, seed=seed)
    lengths = out["response_mask"].sum(dim=1).tolist()
    eos = set(engine.eos_token_ids)
    results = []
    for row, length in enumerate(lengths):
        tokens = out["responses"][row, :length].tolist()
        log_probs = out["rollout_log_probs"][row, :length].tolist()
        results.append(Generated(tokens, log_probs, hit_eos=bool(tokens) and tokens[-1] in eos))
    return results


@dataclasses.dataclass(frozen=True)
class Completion:
    """One choice of a response, final."""

    text: str
    pieces: list[str]  # text deltas, one per token (may be ""): "".join(pieces) == text
    token_ids: list[int]  # the tokens counted as completion tokens (cut after a stop string)
    log_probs: list[float]
    finish_reason: str  # "stop" (EOS or a stop string) or "length" (max_tokens)


def token_pieces(tokenizer: PreTrainedTokenizerBase, token_ids: list[int]) -> list[str]:
    """The text each token adds, decoded incrementally (as vLLM does).

    A token that ends inside a multi-byte character adds "" and the character appears with
    the token that completes it; a short window of earlier tokens gives decoders that depend
    on context (SentencePiece's leading spaces) what they need. Special tokens add nothing.
    """
    pieces, prefix, read = [], 0, 0
    for end in range(1, len(token_ids) + 1):
        before = tokenizer.decode(token_ids[prefix:read], skip_special_tokens=True)
        after = tokenizer.decode(token_ids[prefix:end], skip_special_tokens=True)
        if len(after) > len(before) and not after.endswith("\ufffd"):
            pieces.append(after[len(before) :])
            prefix, read = read, end
        else:
            pieces.append("")
    return pieces


def finish(
    generated: Generated, tokenizer: PreTrainedTokenizerBase, max_tokens: int, stop: tuple[str, ...] = ()
) -> Completion:
    """Cut a response at `max_tokens` and at the first stop string (which is not included)."""
    tokens, log_probs = generated.token_ids[:max_tokens], generated.log_probs[:max_tokens]
    finish_reason = "stop" if generated.hit_eos and len(generated.token_ids) <= max_tokens else "length"
    pieces = token_pieces(tokenizer, tokens)
    text = "".join(pieces)
    hits = [(text.find(s), s) for s in stop if s in text]
    if hits:
        cut, matched = min(hits, key=lambda hit: (hit[0], -len(hit[1])))
        # keep the tokens up to the one that completed the stop string (vLLM counts them too)
        used, covered = 0, 0
        while covered < cut + len(matched):
            covered += len(pieces[used])
            used += 1
        pieces = _clip(pieces[:used], cut)
        tokens, log_probs, text, finish_reason = tokens[:used], log_probs[:used], text[:cut], "stop"
    return Completion(text, pieces, tokens, log_probs, finish_reason)


def _clip(pieces: list[str], length: int) -> list[str]:
    """Pieces whose concatenation is the first `length` characters of theirs."""
    out, total = [], 0
    for piece in pieces:
        keep = piece[: max(0, length - total)]
        out.append(keep)
        total += len(keep)
    return out
