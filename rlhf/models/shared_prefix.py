"""Response logits with each distinct prompt encoded once: the samples of a GRPO group share it.

A GRPO batch holds n samples of every prompt (rows of one prompt adjacent), and the actor,
old-policy and reference forwards all run over `[prompt | response]` rows, so each prompt is
encoded n times. With short answers the prompt is most of the row (arithmetic: 33 prompt
tokens, 3-5 response tokens), so most of that work is repeated. Here the U distinct
prompts go through the model once (filling a KV cache), the cache is gathered to the B rows,
and only the response tokens go through the model again, attending to the shared prompt
keys and values. Autograd sums the gradients of a shared prompt over its rows, so the
logits, log-probs and gradients equal a full forward's up to float rounding
(tests/models/test_shared_prefix.py).

Notation: B rows, U distinct prompts, P prompt tokens (left-padded), R response tokens, V vocabulary.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from rlhf.models.kv_cache import cache_kwargs, output_cache


def response_logits(
    model: torch.nn.Module,
    input_ids: torch.Tensor,  # (B, P+R) = [left-padded prompt | right-padded response]
    attention_mask: torch.Tensor,  # (B, P+R)
    position_ids: torch.Tensor,  # (B, P+R)
    response_length: int,  # R
    prefix_model: torch.nn.Module | None = None,  # the module the prompt pass runs through; None: `model`
) -> torch.Tensor:
    """(B, R, V) logits predicting each response token (position P-1+t predicts response token t).

    Falls back to one ordinary forward when no two rows share a prompt. `prefix_model`: under
    DDP pass the unwrapped module here and the DDP wrapper as `model`, so the wrapper sees one
    forward per backward (gradients of both passes reach the same parameters before the
    reducer's hooks fire).
    """
    r = response_length
    p = input_ids.shape[1] - r
    shared = encode_prompts_once(model, input_ids, attention_mask, position_ids, r, prefix_model, logits_to_keep=1)
    if shared is None or r < 1:
        out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                    logits_to_keep=r + 1, use_cache=False)
        return out.logits[:, :-1, :]
    prefix, cache, inverse = shared
    logits = [prefix.logits[:, -1:, :][inverse]]
    if r > 1:
        suffix = model(
            input_ids=input_ids[:, p : p + r - 1], attention_mask=attention_mask[:, : p + r - 1],
            position_ids=position_ids[:, p : p + r - 1], use_cache=True, **cache_kwargs(model, cache),
        )
        logits.append(suffix.logits)
    return torch.cat(logits, dim=1)


def encode_prompts_once(
    model: torch.nn.Module,
    input_ids: torch.Tensor,  # (B, P+R) = [left-padded prompt | right-padded response]
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    response_length: int,  # R
    prefix_model: torch.nn.Module | None = None,  # as `response_logits`
    **forward_options,  # e.g. logits_to_keep=1 (a causal LM's prompt pass needs the last position only)
) -> tuple[object, DynamicCache, torch.Tensor] | None:
    """(the prompt pass's output over the U distinct prompts, its KV cache gathered to the B rows, inverse (B,):
    each row's prompt index), or None when no two rows share a prompt (nothing to save). A forward of the
    response tokens with that cache then equals the full forward's at those positions."""
    p = input_ids.shape[1] - response_length
    prompt = torch.cat([input_ids[:, :p], attention_mask[:, :p]], dim=1)
    unique, inverse = torch.unique(prompt, dim=0, return_inverse=True)
    if unique.shape[0] == input_ids.shape[0] or p < 1:
        return None
    first = _first_rows(inverse, unique.shape[0])  # a row of each distinct prompt
    owner = prefix_model or model
    cache = DynamicCache(config=getattr(owner, "config", None))
    prefix = owner(
        input_ids=input_ids[first, :p], attention_mask=attention_mask[first, :p], position_ids=position_ids[first, :p],
        use_cache=True, **forward_options, **cache_kwargs(owner, cache),
    )
    cache = output_cache(prefix)
    cache.batch_select_indices(inverse)  # (U, ...) -> (B, ...): differentiable gather
    return prefix, cache, inverse


def _first_rows(inverse: torch.Tensor, u: int) -> torch.Tensor:
    """For each group index g in [0, u), the smallest row i with inverse[i] == g."""
    rows = torch.arange(inverse.shape[0], device=inverse.device)
    first = torch.full((u,), inverse.shape[0], dtype=torch.long, device=inverse.device)
    return first.scatter_reduce(0, inverse, rows, reduce="amin")
