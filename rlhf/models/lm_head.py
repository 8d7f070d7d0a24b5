"""Running a causal LM up to its LM head, so the head can be applied block by block.

`rlhf.algos.linear_log_probs_and_entropy` needs the final hidden states and the head's weight
instead of the (B, T, V) logits. Hugging Face causal LMs apply `lm_head` to the hidden states
after slicing them by `logits_to_keep`; swapping the head for an identity for the duration of
a forward makes `.logits` those hidden states, through whatever wrapper (DDP, the shared-prefix
forward) calls the model, so nothing else changes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


def fusable_lm_head(model: torch.nn.Module) -> torch.nn.Linear | None:
    """The model's LM head if it is a plain bias-free Linear without hooks; else None."""
    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else None
    if type(head) is not torch.nn.Linear or head.bias is not None:
        return None
    if head._forward_hooks or head._forward_pre_hooks:
        return None
    return head


@contextlib.contextmanager
def lm_head_bypassed(model: torch.nn.Module) -> Iterator[torch.nn.Linear]:
    """Within the block, `model(...).logits` are the LM head's inputs; yields the head."""
    head = fusable_lm_head(model)
    if head is None:
        raise ValueError(f"{type(model).__name__} has no plain bias-free Linear LM head to bypass")
    model.set_output_embeddings(torch.nn.Identity())
    try:
        yield head
    finally:
        model.set_output_embeddings(head)
