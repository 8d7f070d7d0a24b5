"""A KV-cache sampling loop for Hugging Face causal LMs that prefills each prompt once for its n samples.

`transformers`' `generate` with n samples per prompt repeats every prompt n times before the
prefill, so the prompt is encoded n times, and each decoding step runs its generic machinery
(input preparation, logits processors, stopping criteria, cache bookkeeping) around the model
call. For RL rollouts (GRPO: 8 samples per prompt, short answers) the prefill dominates, and
that machinery is a fixed cost per step. `sample` prefills the U distinct prompts once,
repeats their KV cache n times, and decodes with a plain loop that does only what sampling
needs. It samples from the same distribution as `generate` (temperature, then top-k, then
top-p, as transformers' warpers do, then one draw from the softmax; `argmax` when greedy),
with the same handling of finished rows (padding after EOS; the responses end with the
longest one), so it gives the same greedy tokens; tests/rollout/test_fast_engine.py
checks greedy equality, log-probs and the sampling distribution against `generate`. The draw
inverts the CDF at one uniform number per row instead of `torch.multinomial`, so a seed
gives different (equally distributed) samples than `generate`.

Rows leave the batch as they finish (continuous batching). A static batch decodes every row
until its slowest row ends: with natural response lengths (SmolLM2, mean 71 of at most 128
tokens) most of its work went to rows that had already finished. `sample` drops a finished row
at the next check, KV cache and all per-row state included (swap-remove: the last survivors move
into the holes, so a drop copies at most as many rows as it removes), and, when the rows are
capped (`max_rows`, the KV cache's size), admits pending prompt groups into the free slots, each
with its own prefill. docs/performance.md has the measurements; `continuous=False` keeps the
static batch for comparison.

The loop never waits for the device between checks: "which rows have finished?" is read on the
host every `check_every` steps (`default_check_every`: 1 on a CPU, 16 on an accelerator); the
few steps a row decodes past its EOS are cut off after the loop (tests/rollout/test_decode_cadence.py).
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from rlhf.models.kv_cache import cache_kwargs, output_cache
from rlhf.rollout.lean_decoder import LeanDecoder, supports


BATCH_INVARIANT_ROWS = 4
"""A matmul over 4 or more rows gives each row the same bits whatever the batch size; over 1-3 rows
they differ in the last bits (fp32 GEMM on x86 picks another kernel below 4 rows, measured with torch
2.13's CPU build). Dropping finished rows never takes a batch that started with 4 or more rows below 4
(the lean step pads its matmul inputs with zero rows, the model's forward keeps finished rows), so a
row's arithmetic, and its greedy tokens, do not depend on which rows decode beside it."""


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


def draw(probs: torch.Tensor, uniform: torch.Tensor | None = None) -> torch.Tensor:
    """One token per row of probs (B,V), by inverting the CDF at a uniform draw.

    The same distribution as `torch.multinomial(probs, 1)` with one random number per row
    instead of one per vocabulary entry (multinomial draws V exponentials per row: 25% of the
    decoding time of a 140k-parameter model). Tokens of probability 0 are never drawn: `right=True`
    picks the first index whose cumulative sum exceeds u, and u < the total. `uniform` (B,1):
    the numbers in [0, 1) to use (None: drawn here).
    """
    cdf = probs.cumsum(dim=-1)
    if uniform is None:
        uniform = torch.rand((probs.shape[0], 1), device=probs.device, dtype=cdf.dtype)
    u = uniform * cdf[:, -1:]
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


def _check_equal_across_ranks(value: int, what: str, device: torch.device) -> None:
    """Raise ValueError on every rank unless every rank of the default process group has the same `value`."""
    extremes = torch.tensor([value, -value], dtype=torch.int64, device=device)  # on the device: NCCL needs it
    torch.distributed.all_reduce(extremes, op=torch.distributed.ReduceOp.MAX)
    most, fewest = int(extremes[0]), -int(extremes[1])
    if most != fewest:
        raise ValueError(
            f"sample: the ranks of a sharded model got different numbers of {what} ({fewest} to {most}); each "
            "prefill is a collective, so they would wait for each other forever. Give every rank as many (the "
            "worker group pads its shards to equal sizes)."
        )


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


def _prefill(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor):
    """(last logits (U,V) in fp32, DynamicCache, mask (U,P)) of the model's forward over left-padded prompts,
    trimmed of the columns that pad every one of them."""
    keep = attention_mask.any(dim=0)
    start = int(keep.int().argmax()) if bool(keep.any()) else 0
    input_ids, attention_mask = input_ids[:, start:], attention_mask[:, start:]
    positions = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    cache = DynamicCache(config=getattr(model, "config", None))
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions,
                use_cache=True, logits_to_keep=1, **cache_kwargs(model, cache))
    return out.logits[:, -1].float(), output_cache(out), attention_mask


class _ModelSteps:
    """Decoding steps through the model's own forward and DynamicCache, for one wave of rows admitted together
    (the fallback for models the lean step does not reproduce: adapters, other architectures, hooks)."""

    def __init__(self, model: torch.nn.Module, cache: DynamicCache, attention_mask: torch.Tensor, n: int, steps: int):
        if n > 1:
            cache.batch_repeat_interleave(n)
            attention_mask = attention_mask.repeat_interleave(n, dim=0)
        b, p = attention_mask.shape
        self.model, self.cache, self.prompt_len, self.t = model, cache, p, 0
        self.mask = torch.ones((b, p + steps), dtype=attention_mask.dtype, device=attention_mask.device)
        self.mask[:, :p] = attention_mask
        self.next_pos = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)[:, -1:] + 1

    def step(self, token: torch.Tensor) -> torch.Tensor:
        out = self.model(input_ids=token[:, None], attention_mask=self.mask[:, : self.prompt_len + self.t + 1],
                         position_ids=self.next_pos + self.t, use_cache=True, logits_to_keep=1,
                         **cache_kwargs(self.model, self.cache))
        self.t += 1
        return out.logits[:, -1]

    def select(self, keep: list[int]) -> None:
        index = torch.tensor(keep, dtype=torch.long, device=self.mask.device)
        self.cache.batch_select_indices(index)
        self.mask, self.next_pos = self.mask[index], self.next_pos[index]


def _swap_remove(alive: list[bool]) -> list[int]:
    """The rows to keep, in their new order: survivors stay in place, the last survivors fill the holes.

    [T, F, T, T, F, T] -> [0, 5, 2, 3]: only row 5 moves (into row 1's place).
    """
    survivors = [i for i, a in enumerate(alive) if a]
    b = len(survivors)
    movers = iter(i for i in survivors if i >= b)
    return [i if alive[i] else next(movers) for i in range(b)]


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
    min_new_tokens: int = 0,  # EOS is masked out of each row's first min_new_tokens steps (transformers' min_new_tokens)
    lean: bool = True,  # decoding steps through rlhf.rollout.lean_decoder where the model supports it
    check_every: int | None = None,  # steps between "which rows finished?" host checks; None: default_check_every
    max_rows: int | None = None,  # rows decoding at once (whole prompt groups, at least one); None: all U*n
    continuous: bool = True,  # drop finished rows at each check and refill their slots; False: static batches
) -> tuple[torch.Tensor, torch.Tensor]:
    """(responses (U*n,R), log_probs (U*n,R)); R <= max_new_tokens is the length of the longest response.

    Rows that emitted EOS are padded with `pad_token_id` afterwards. At most `max_rows` rows
    decode at once (the KV cache is sized for them). With `continuous`, every check drops the
    rows that finished (KV cache included: they cost nothing from then on) and, where the step
    allows it, admits pending prompt groups into the free slots (continuous batching); without
    it, prompts are decoded in static waves of `max_rows` rows, each until its slowest row ends.
    Which rows finished is read on the host only every `check_every` steps (the loop itself
    never waits for the device), so a finished row may decode up to check_every - 1 more steps;
    those are cut off, so the outputs do not depend on `check_every`. `log_probs` are each sampled
    token's log-prob under softmax(logits / logprob_temperature), before top-k/top-p truncation
    and EOS masking (verl's convention, and what the trainer computes); 0 on padding.

    Greedy tokens do not depend on `max_rows`, `continuous` or `check_every` (each row's
    arithmetic is its own). Sampling draws one uniform number per output row and step, so with
    a seed, when every row decodes in one wave (max_rows None), the samples do not depend on
    `continuous` or `check_every` either; admitted later (refill, waves), a row's draws come
    from later steps: other samples, the same distribution.

    Under FSDP (a sharded module in a process group of several ranks) the model's own forward
    all-gathers weights, so every rank must run as many forwards: the lean step runs none per
    step and gathers the weights once per call; prompts are then admitted in waves (each wave's
    prefill is one forward on every rank, and ranks hold equal numbers of prompts), never
    mid-wave. Without the lean step, ranks also agree at each check whether any row of any rank
    is still decoding (an all-reduce), and a rank keeps finished rows decoding until then (at
    least one; at least BATCH_INVARIANT_ROWS where it has them). Ranks given different numbers of
    prompts would run different numbers of prefills: that is refused at once (ValueError on every
    rank) instead of hanging in a collective.
    """
    device = input_ids.device
    u = input_ids.shape[0]
    every = check_every or default_check_every(device)
    if every < 1:
        raise ValueError(f"sample: check_every must be >= 1 (or None for the device default), got {check_every}")
    if max_rows is not None and max_rows < 1:
        raise ValueError(f"sample: max_rows must be >= 1 (or None: all rows at once), got {max_rows}")
    sharded = _sharded(model)
    if sharded:
        _check_equal_across_ranks(u, "prompts", device)
    if u == 0:
        empty = torch.zeros((0, 0), dtype=torch.long, device=device)
        return empty, empty.float()
    groups = u if max_rows is None else max(1, min(u, max_rows // n))  # prompt groups decoding at once
    capacity = groups * n
    width = max_new_tokens + every  # a finished row decodes up to every - 1 steps past its end before a check
    tokens = torch.full((u * n, width), pad_token_id, dtype=torch.long, device=device)
    log_probs = torch.zeros((u * n, width), dtype=torch.float32, device=device)
    eos = torch.tensor(eos_token_ids, device=device)
    is_eos = None  # (V,) True at the EOS ids, once the vocabulary is known
    prompt_columns = int(attention_mask.any(dim=0).sum())  # the longest prompt, left padding trimmed
    use_lean = lean and supports(model, length=prompt_columns + max_new_tokens)
    refill = continuous and use_lean and not sharded  # admit prompts mid-wave: their prefill is no collective then
    synced = sharded and not use_lean  # every decoding step is a collective: ranks agree when to stop
    greedy = temperature == 0
    admit_at = max(n, capacity // 8)  # free rows worth a prefill mid-wave (each prefill reads every weight once)

    decoder = None
    rows = torch.zeros(0, dtype=torch.long, device=device)  # (b,) output row of each active row
    t = torch.zeros(0, dtype=torch.long, device=device)  # (b,) tokens each active row has decoded
    unfinished = torch.zeros(0, dtype=torch.bool, device=device)
    logits = token = None
    born: list[int] = []  # host: the step at which each active row was admitted
    next_prompt = steps = since_check = 0
    while True:
        b = len(born)
        if next_prompt < u and (b == 0 or (refill and capacity - b >= admit_at)):
            k = min((capacity - b) // n, u - next_prompt)
            new_logits, cache, mask = _prefill(model, input_ids[next_prompt : next_prompt + k],
                                               attention_mask[next_prompt : next_prompt + k])
            if use_lean:
                if decoder is None:  # built once per call: the weights are gathered once
                    dtype = cache.layers[0].keys.dtype  # what the model's own forward computed in
                    decoder = LeanDecoder(model, capacity, prompt_columns + max_new_tokens + every - 1, dtype, device,
                                          min_rows=min(BATCH_INVARIANT_ROWS, k * n))
                decoder.add(cache, mask, n)
            else:
                decoder = _ModelSteps(model, cache, mask, n, width)
            del cache
            new_logits = new_logits.repeat_interleave(n, dim=0) if n > 1 else new_logits
            logits = new_logits if b == 0 else torch.cat([logits, new_logits])
            rows = torch.cat([rows, torch.arange(next_prompt * n, (next_prompt + k) * n, device=device)])
            t = torch.cat([t, torch.zeros(k * n, dtype=torch.long, device=device)])
            unfinished = torch.cat([unfinished, torch.ones(k * n, dtype=torch.bool, device=device)])
            born.extend([steps] * (k * n))
            next_prompt += k
            if is_eos is None:
                is_eos = torch.zeros(logits.shape[1], dtype=torch.bool, device=device)
                is_eos[eos] = True
        scores = logits
        if steps - max(born) < min_new_tokens:  # some row is still within its first min_new_tokens steps
            scores = logits.masked_fill((t < min_new_tokens)[:, None] & is_eos, -float("inf"))
        if greedy:
            token = scores.argmax(dim=-1)
        else:
            # one number per output row and step, whichever rows are active: a seed's samples do not
            # depend on when rows are dropped (nor, in one wave, on continuous batching at all)
            uniform = torch.rand((u * n, 1), device=device, dtype=torch.float32)[rows]
            token = draw(torch.softmax(warp_logits(scores, temperature, top_k, top_p), dim=-1), uniform)
        token = torch.where(unfinished, token, pad_token_id)
        scaled = logits / logprob_temperature if logprob_temperature != 1.0 else logits
        chosen = scaled.gather(1, token[:, None]).squeeze(1) - torch.logsumexp(scaled, dim=-1)
        column = t.clamp(max=width - 1)  # a finished row kept decoding under FSDP writes past its end
        tokens[rows, column] = token
        log_probs[rows, column] = torch.where(unfinished, chosen, 0.0)
        t += 1
        unfinished &= ~torch.isin(token, eos) & (t < max_new_tokens)
        steps += 1
        since_check += 1
        if steps - max(born) >= max_new_tokens:  # every row reached the limit: finished, no need to look
            alive = [False] * len(born)
        elif since_check >= every:
            alive = unfinished.tolist()
        else:
            alive = None
        if alive is not None:
            since_check = 0
            any_alive = _any_unfinished(torch.tensor(any(alive)), synced) if synced else any(alive)
            if not continuous:
                alive = [any_alive] * len(alive)  # a static wave ends with its slowest row
            elif not use_lean and any_alive:
                # the model's forward keeps finished rows: a batch of at least BATCH_INVARIANT_ROWS rows (or all
                # of them), and under FSDP at least one row while another rank's rows still decode
                floor = min(BATCH_INVARIANT_ROWS, len(alive))
                for i in [i for i, a in enumerate(alive) if not a][: max(0, floor - sum(alive))]:
                    alive[i] = True
            if not all(alive):
                keep = _swap_remove(alive)
                decoder.select(keep)
                index = torch.tensor(keep, dtype=torch.long, device=device)
                rows, t, unfinished, token = rows[index], t[index], unfinished[index], token[index]
                born = [born[i] for i in keep]
            if not born and next_prompt == u:
                break
            if not born:
                continue
        logits = decoder.step(token).float()
    r = decoded_length(tokens, eos, max_new_tokens)
    return tokens[:, :r], log_probs[:, :r]
