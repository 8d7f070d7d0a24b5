"""Per-token log-probs and entropy of a batch's responses under a policy model, in float32.

The one forward that the policy worker's log-prob passes (old, reference) and its update share: logits
only at the response positions, left in the compute dtype and turned into float32 block by block
(`rlhf.algos.logprobs`), optionally with each group's shared prompt encoded once
(`rlhf.models.shared_prefix`) and the LM head fused into the log-prob kernel (`rlhf.models.lm_head`).
"""

from __future__ import annotations

import contextlib

import torch

from rlhf.algos import linear_log_probs_and_entropy, log_probs_and_entropy, log_probs_at, top_k_log_probs
from rlhf.batch import Batch
from rlhf.models.lm_head import lm_head_bypassed
from rlhf.models.shared_prefix import response_logits

__all__ = ["response_log_probs", "response_outputs", "response_log_probs_with_top_k", "teacher_scores"]


def response_log_probs(
    model: torch.nn.Module,
    batch: Batch,
    temperature: float,
    with_entropy: bool = False,
    shared_prefix: bool = False,
    prefix_model: torch.nn.Module | None = None,
    block_elements: int | None = None,
    fused_lm_head: bool = False,
    keep_logits: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probs (B,T) of `responses` under `model`, and entropy (B,T) or None, in float32.

    Logits are computed only for response positions (`logits_to_keep`) and stay in the
    model's compute dtype: the temperature and the float32 cast happen block by block inside
    `log_probs_and_entropy`, never on the whole (B,T,V) tensor. The entropy is differentiable;
    detach it for a metric. `shared_prefix`: encode each distinct prompt once for all its rows
    (rlhf.models.shared_prefix; equal up to float rounding, and much cheaper when the n samples
    of a group share a long prompt); `prefix_model` is the unwrapped module under DDP;
    `block_elements`: the float32 temporaries' budget (rlhf.algos.logprobs; None: per device);
    `fused_lm_head`: apply the LM head inside the log-prob function (`linear_log_probs_and_entropy`):
    the (B,T,V) logits and their gradient never exist side by side; needs a plain Linear head
    (`fusable_lm_head`). `keep_logits` (with `fused_lm_head`): keep the logits for backward, which
    turns them into their gradient in place, instead of recomputing them block by block.
    """
    unwrapped = prefix_model or model
    with lm_head_bypassed(unwrapped) if fused_lm_head else contextlib.nullcontext() as head:
        outputs = response_outputs(model, batch, shared_prefix, prefix_model)  # hidden states when bypassed
    responses = batch["responses"]
    if head is not None:
        return linear_log_probs_and_entropy(outputs, head.weight, responses, temperature=temperature,
                                            with_entropy=with_entropy, max_block_elements=block_elements,
                                            keep_logits=keep_logits)
    return log_probs_and_entropy(outputs, responses, temperature=temperature, with_entropy=with_entropy,
                                 max_block_elements=block_elements)


def response_log_probs_with_top_k(
    model: torch.nn.Module,
    batch: Batch,
    temperature: float,
    ids: torch.Tensor,
    shared_prefix: bool = False,
    prefix_model: torch.nn.Module | None = None,
    block_elements: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """For a top-k distillation loss: from one forward with the model's own head (the full (B,T,V) logits,
    not fused), the sampled tokens' log-probs (B,T) and entropy (B,T), the log-probs of `ids` (B,T,K; the
    teacher's top-k) (B,T,K), all with gradient, and the model's own top-k ids (B,T,K) (no gradient)."""
    logits = response_outputs(model, batch, shared_prefix, prefix_model)
    log_probs, entropy = log_probs_and_entropy(logits, batch["responses"], temperature=temperature,
                                               with_entropy=True, max_block_elements=block_elements)
    at_ids = log_probs_at(logits, ids, temperature=temperature, max_block_elements=block_elements)
    own = logits.detach().topk(ids.shape[-1], dim=-1).indices
    return log_probs, entropy, at_ids, own


@torch.no_grad()
def teacher_scores(model: torch.nn.Module, batch: Batch, temperature: float, top_k: int, shared_prefix: bool = False,
                   block_elements: int | None = None) -> torch.Tensor:
    """A teacher's view of the sampled responses from one forward: (B,T,1+2K) float64 holding the sampled
    tokens' log-probs, then its top-k tokens' log-probs, then their ids (exact in float64), all at `temperature`."""
    logits = response_outputs(model, batch, shared_prefix, None)
    log_probs = log_probs_and_entropy(logits, batch["responses"], temperature=temperature,
                                      max_block_elements=block_elements)[0]
    ids, top = top_k_log_probs(logits, top_k, temperature=temperature, max_block_elements=block_elements)
    return torch.cat([log_probs.unsqueeze(-1).double(), top.double(), ids.double()], dim=-1)


def response_outputs(model, batch: Batch, shared_prefix: bool, prefix_model) -> torch.Tensor:
    """(B, R, ...) outputs of the model at the positions predicting each response token."""
    r = batch["responses"].shape[1]
    if shared_prefix:
        return response_logits(model, batch["input_ids"], batch["attention_mask"], batch["position_ids"], r,
                               prefix_model=prefix_model)
    return model(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        position_ids=batch["position_ids"],
        logits_to_keep=r + 1,
        use_cache=False,
    ).logits[:, :-1, :]
