"""A KV-cache sampling loop for Hugging Face causal LMs that prefills each prompt once for its n samples.

`transformers`' `generate` with n samples per prompt repeats every prompt n times before the
prefill, so the prompt is encoded n times, and each decoding step runs its generic machinery
(input preparation, logits processors, stopping criteria, cache bookkeeping) around the model
call. For RL rollouts (GRPO: 8 samples per prompt, short answers) the prefill dominates, and
that machinery is a fixed cost per step. `sample` prefills the U distinct prompts once,
repeats their KV cache n times, and decodes with a plain loop that does only what sampling
needs. It samples from the same distribution as `generate` (temperature, then top-k, then
top-p, as transformers' warpers do, then one draw from the softmax; `argmax` when greedy),
with the same handling of finished rows (padding after EOS; the responses end at the step
where the last row finished), so it gives the same greedy tokens; tests/rollout/test_fast_engine.py
checks greedy equality, log-probs and the sampling distribution against `generate`. The draw
inverts the CDF at one uniform number per row instead of `torch.multinomial`, so a seed
gives different (equally distributed) samples than `generate`.

The loop never waits for the device between checks: "has every row finished?" is read on the
host every `check_every` steps (`default_check_every`: 1 on a CPU, 16 on an accelerator), the
few steps decoded past the last EOS are cut off after the loop (tests/rollout/test_decode_cadence.py).
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from rlhf.rollout.lean_decoder import LeanDecoder, supports


def warp_logits(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """Logits (B,V) -> sampling scores (B,V): /temperature, top-k, top-p (transformers' warpers, same order).

    Removed tokens get -inf. top_k 0 and top_p 1.0 disable their filter.
    """
    scores = logits / temperature if temperature != 1.0 else logits
    if top_k > 0:
        k = min(top_k, scores.shape[-1])
        kth = torch.topk(scores, k)[0][..., -1, None]
        scores = scores.masked_fill(scores < kth, -float("inf"))
    if top_p < 1.0:
        sorted_scores, sorted_idx = torch.sort(scores, descending=False)
        cumulative = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
        remove_sorted = cumulative <= (1 - top_p)
        remove_sorted[..., -1:] = False  # always keep the most likely token
        remove = remove_sorted.scatter(1, sorted_idx, remove_sorted)
        scores = scores.masked_fill(remove, -float("inf"))
    return scores


def draw(probs: torch.Tensor) -> torch.Tensor:
    """One token per row of probs (B,V), by inverting the CDF at a uniform draw.

    The same distribution as `torch.multinomial(probs, 1)` with one random number per row
    instead of one per vocabulary entry (multinomial draws V exponentials per row: 25% of the
    decoding time of a 140k-parameter model). Tokens of probability 0 are never drawn: `right=True`
    picks the first index whose cumulative sum exceeds u, and u < the total.
    """
    cdf = probs.cumsum(dim=-1)
    u = torch.rand((probs.shape[0], 1), device=probs.device, dtype=cdf.dtype) * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).squeeze(1).clamp_(max=probs.shape[-1] - 1)


def default_check_every(device: torch.device) -> int:
    """Decoding steps between checks for "every row has finished" when the caller gives none.

    A check reads a device flag on the host. On a CPU ops run synchronously, so it waits for
    nothing, while every step past the finish is pure waste: check every step (1). On an
    accelerator a check drains the launch queue: the host waits for the device to finish, then
    the device idles while the host launches the next step (generation was launch-bound on an
    H100: CUDA busy 1.4 s of ~4 s). 16 cuts those waits 16-fold for at most 15 steps decoded
    past the last row's EOS (7.5 on average: ~3% of a 256-token rollout).
    """
    return 1 if device.type == "cpu" else 16


def _any_unfinished(unfinished: torch.Tensor, synced: bool) -> bool:
    """The host-side "some row is still decoding" flag; `synced`: the maximum over the default process group.

    A module sharded by FSDP2 decoding through its own forward all-gathers weights in every step,
    so a rank that stops while another decodes leaves that one in a collective forever: such
    ranks must agree when to stop. The lean step runs no collective and needs no agreement.
    """
    flag = unfinished.any()
    if synced:
        flag = flag.to(torch.int32)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
    return bool(flag)


def _sharded(model: torch.nn.Module) -> bool:
    """True for an FSDP2-sharded module in a process group of more than one rank."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return False
    from torch.distributed.fsdp import FSDPModule

    return torch.distributed.get_world_size() > 1 and any(isinstance(m, FSDPModule) for m in model.modules())


def decoded_length(tokens: torch.Tensor, eos: torch.Tensor, steps: int) -> int:
    """The step at which the last row emitted EOS (steps when some row never did): R of `sample`.

    tokens (B,S) holds S >= R decoded steps, padded after each row's first EOS. One host sync.
    """
    is_eos = torch.isin(tokens[:, :steps], eos)
    first = torch.where(is_eos.any(dim=1), is_eos.int().argmax(dim=1) + 1, steps)  # (B,) row length
    return int(first.max()) if tokens.shape[0] else 0


@torch.no_grad()
def sample(
    model: torch.nn.Module,
    input_ids: torch.Tensor,  # (U,P) left-padded prompts
    attention_mask: torch.Tensor,  # (U,P) 1 on prompt tokens
    n: int,  # samples per prompt; rows of one prompt are adjacent in the outputs
    max_new_tokens: int,
    eos_token_ids: list[int],
    pad_token_id: int,
    temperature: float = 1.0,  # 0: greedy (argmax)
    top_k: int = 0,
    top_p: float = 1.0,
    logprob_temperature: float = 1.0,  # the temperature the returned log-probs are computed at
    min_new_tokens: int = 0,  # EOS is masked out of the first min_new_tokens steps (transformers' min_new_tokens)
    lean: bool = True,  # decoding steps through rlhf.rollout.lean_decoder where the model supports it
    check_every: int | None = None,  # steps between "all rows finished?" host checks; None: default_check_every
) -> tuple[torch.Tensor, torch.Tensor]:
    """(responses (U*n,R), log_probs (U*n,R)); R <= max_new_tokens is the step at which the last row finished.

    Rows that emitted EOS are padded with `pad_token_id` afterwards. Whether every row has
    emitted EOS is read on the host only every `check_every` steps (the loop itself never waits
    for the device), so up to check_every - 1 steps may run past the last EOS; they are cut off,
    so the outputs do not depend on `check_every`. Those steps draw random numbers, so the
    global RNG state after a sampled call does. `log_probs` are each sampled token's log-prob
    under softmax(logits / logprob_temperature), before top-k/top-p truncation and EOS masking
    (verl's convention, and what the trainer computes); 0 on padding.
    """
    device = input_ids.device
    u, p = input_ids.shape
    b = u * n
    every = check_every or default_check_every(device)
    if every < 1:
        raise ValueError(f"sample: check_every must be >= 1 (or None for the device default), got {check_every}")
    positions = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    cache = DynamicCache(config=getattr(model, "config", None))
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions,
                past_key_values=cache, use_cache=True, logits_to_keep=1)
    logits = out.logits[:, -1].float()
    cache = out.past_key_values
    del out
    mask = torch.ones((b, p + max_new_tokens), dtype=attention_mask.dtype, device=device)
    mask[:, :p] = attention_mask.repeat_interleave(n, dim=0) if n > 1 else attention_mask
    next_pos = positions[:, -1:].repeat_interleave(n, dim=0) + 1 if n > 1 else positions[:, -1:] + 1
    # the samples of a prompt share its prefill: its KV cache is repeated n times
    decoder = None
    if lean and supports(model, length=p + max_new_tokens):
        decoder = LeanDecoder(model, cache, n, mask, next_pos, max_new_tokens)
        cache = None  # the decoder holds its own copy: the prefill's cache is freed
    elif n > 1:
        cache.batch_repeat_interleave(n)
    if n > 1:
        logits = logits.repeat_interleave(n, dim=0)
    eos = torch.tensor(eos_token_ids, device=device)
    unfinished = torch.ones(b, dtype=torch.bool, device=device)
    tokens = torch.full((b, max_new_tokens), pad_token_id, dtype=torch.long, device=device)
    log_probs = torch.zeros((b, max_new_tokens), dtype=torch.float32, device=device)
    greedy = temperature == 0
    synced = decoder is None and _sharded(model)  # every rank must run the same number of steps
    steps = 0
    for t in range(max_new_tokens):
        scores = logits.index_fill(1, eos, -float("inf")) if t < min_new_tokens else logits
        if greedy:
            token = scores.argmax(dim=-1)
        else:
            token = draw(torch.softmax(warp_logits(scores, temperature, top_k, top_p), dim=-1))
        token = torch.where(unfinished, token, pad_token_id)
        scaled = logits / logprob_temperature if logprob_temperature != 1.0 else logits
        chosen = scaled.gather(1, token[:, None]).squeeze(1) - torch.logsumexp(scaled, dim=-1)
        log_probs[:, t] = torch.where(unfinished, chosen, 0.0)
        tokens[:, t] = token
        steps = t + 1
        unfinished &= ~torch.isin(token, eos)
        if steps == max_new_tokens or (steps % every == 0 and not _any_unfinished(unfinished, synced)):
            break
        if decoder is not None:
            logits = decoder.step(token, t).float()
        else:
            out = model(input_ids=token[:, None], attention_mask=mask[:, : p + t + 1], position_ids=next_pos + t,
                        past_key_values=cache, use_cache=True, logits_to_keep=1)
            logits = out.logits[:, -1].float()
    # one local check per step stops exactly at the last EOS; otherwise cut back to it
    r = steps if every == 1 and not synced else decoded_length(tokens, eos, steps)
    return tokens[:, :r], log_probs[:, :r]
