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

import dataclasses

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


DRAW_BLOCK = 1024
"""Vocabulary entries per block of `draw`'s two-level CDF. One cumulative sum over SmolLM2's 64 x 49,152
probabilities took 7.4 ms a step on one core (a scan does not vectorise); block sums, a cumulative sum over
the 48 block totals and one over the chosen block's 1,024 entries read the probabilities once."""


def draw(probs: torch.Tensor, uniform: torch.Tensor | None = None) -> torch.Tensor:
    """One token per row of probs (B,V), by inverting the CDF at a uniform draw.

    The same distribution as `torch.multinomial(probs, 1)` with one random number per row
    instead of one per vocabulary entry (multinomial draws V exponentials per row: 25% of the
    decoding time of a 140k-parameter model). The CDF is inverted in two levels: the block of
    `DRAW_BLOCK` entries whose cumulative total first exceeds u, then the entry within it (the
    same token as one cumulative sum over the whole row, up to rounding at a boundary). Tokens of
    probability 0 are never drawn: each level picks the first index whose cumulative sum exceeds
    its target, and each target is kept below its total. `probs` may be unnormalised. `uniform`
    (B,1): the numbers in [0, 1) to use (None: drawn here).
    """
    rows, vocab = probs.shape
    if uniform is None:
        uniform = torch.rand((rows, 1), device=probs.device, dtype=torch.float32)
    full, tail = divmod(vocab, DRAW_BLOCK)
    sums = probs[:, : full * DRAW_BLOCK].reshape(rows, full, DRAW_BLOCK).sum(dim=-1)
    if tail:
        sums = torch.cat([sums, probs[:, full * DRAW_BLOCK :].sum(dim=-1, keepdim=True)], dim=1)
    cdf = sums.cumsum(dim=-1)
    u = _below(uniform.to(cdf.dtype) * cdf[:, -1:], cdf[:, -1:])
    block = torch.searchsorted(cdf, u, right=True).clamp_(max=cdf.shape[1] - 1)  # (B,1)
    before = torch.where(block > 0, cdf.gather(1, (block - 1).clamp(min=0)), 0.0)
    index = block * DRAW_BLOCK + torch.arange(DRAW_BLOCK, device=probs.device)  # (B, DRAW_BLOCK)
    inside = probs.gather(1, index.clamp(max=vocab - 1))
    if tail:
        inside = inside.masked_fill(index >= vocab, 0.0)
    inner = inside.cumsum(dim=-1)
    offset = _below((u - before).clamp(min=0.0), inner[:, -1:])
    within = torch.searchsorted(inner, offset, right=True).clamp_(max=DRAW_BLOCK - 1)
    return (block * DRAW_BLOCK + within).squeeze(1)


def _below(target: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
    """`target` kept strictly below `total` (rounding may take u * total, or a remainder, up to it)."""
    return torch.minimum(target, torch.nextafter(total, torch.zeros_like(total)))


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


@dataclasses.dataclass(frozen=True)
class _Sampling:
    """What a step needs to turn logits into tokens and log-probs: `sample`'s arguments, fixed for a call."""

    temperature: float  # 0: greedy (argmax)
    top_k: int
    top_p: float
    logprob_temperature: float
    min_new_tokens: int
    max_new_tokens: int
    eos: torch.Tensor  # (E,) the EOS ids
    pad_token_id: int


class _Rows:
    """The b rows decoding now, in the decoder's row order, and the (U*n, W) outputs they write.

    Per active row: `rows` its output row, `t` the tokens it has decoded, `unfinished` whether it is
    still decoding, `born` (host) the step it was admitted at. `logits` (b,V) predict every active
    row's next token; `token` (b,) holds the last tokens chosen.
    """

    def __init__(self, total: int, width: int, pad_token_id: int, device: torch.device):
        self.tokens = torch.full((total, width), pad_token_id, dtype=torch.long, device=device)
        self.log_probs = torch.zeros((total, width), dtype=torch.float32, device=device)
        self.rows = torch.zeros(0, dtype=torch.long, device=device)
        self.t = torch.zeros(0, dtype=torch.long, device=device)
        self.unfinished = torch.zeros(0, dtype=torch.bool, device=device)
        self.born: list[int] = []
        self.logits: torch.Tensor | None = None
        self.token: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.born)

    def extend(self, logits: torch.Tensor, first_row: int, count: int, step: int) -> None:
        """Append `count` rows writing output rows first_row.., their first logits (count,V), admitted at `step`."""
        device = self.rows.device
        self.logits = logits if not self.born else torch.cat([self.logits, logits])
        self.rows = torch.cat([self.rows, torch.arange(first_row, first_row + count, device=device)])
        self.t = torch.cat([self.t, torch.zeros(count, dtype=torch.long, device=device)])
        self.unfinished = torch.cat([self.unfinished, torch.ones(count, dtype=torch.bool, device=device)])
        self.born.extend([step] * count)

    def keep(self, keep: list[int]) -> None:
        """Keep the rows `keep` (indices of active rows, in their new order); the logits are the next step's."""
        index = torch.tensor(keep, dtype=torch.long, device=self.rows.device)
        self.rows, self.t, self.unfinished = self.rows[index], self.t[index], self.unfinished[index]
        self.token = self.token[index]
        self.born = [self.born[i] for i in keep]


def _sample_step(active: _Rows, s: _Sampling, since_admission: int) -> None:
    """Choose each active row's next token from `active.logits`, write it and its log-prob, mark the rows that end.

    EOS is masked out of a row's first `min_new_tokens` tokens (`since_admission`: steps since the
    last rows joined; below min_new_tokens some row may still be within them). Sampling draws one
    uniform number per output row, whichever rows are active, so a seed's samples do not depend on
    when rows are dropped (nor, in one wave, on continuous batching at all). A finished row writes
    the pad token with log-prob 0. No host sync. Each pass over the (b,V) logits costs 2-4 ms at
    SmolLM2's 64 x 49,152 on one core, so the step makes few: the EOS mask is written in place (or into
    the probabilities: `draw` takes them unnormalised), and at temperature = logprob_temperature
    without top-k/top-p the log-prob is the log of the sampling probability (no logsumexp pass).
    """
    logits = active.logits
    blocked = None  # (b,1) rows whose EOS is masked out this step
    if since_admission < s.min_new_tokens:
        blocked = (active.t < s.min_new_tokens)[:, None]
    if s.temperature == 0:
        if blocked is not None:  # masked in place (a masked copy of (b,V) costs 6 ms at SmolLM2's 64 x 49,152)
            eos_logits = logits[:, s.eos]
            logits[:, s.eos] = eos_logits.masked_fill(blocked, -float("inf"))
            token = logits.argmax(dim=-1)
            logits[:, s.eos] = eos_logits  # the log-probs are those before the mask
        else:
            token = logits.argmax(dim=-1)
    else:
        probs = torch.softmax(warp_logits(logits, s.temperature, s.top_k, s.top_p), dim=-1)
        if blocked is not None:  # `draw` takes unnormalised probabilities: the same distribution as masking logits
            probs[:, s.eos] = probs[:, s.eos].masked_fill(blocked, 0.0)
        uniform = torch.rand((active.tokens.shape[0], 1), device=logits.device, dtype=torch.float32)[active.rows]
        token = draw(probs, uniform)
    token = torch.where(active.unfinished, token, s.pad_token_id)
    if s.temperature != 0 and s.temperature == s.logprob_temperature and s.top_k == 0 and s.top_p == 1.0:
        chosen = probs.gather(1, token[:, None]).squeeze(1).log()  # the sampling softmax is the log-prob's
    else:
        scaled = logits / s.logprob_temperature if s.logprob_temperature != 1.0 else logits
        chosen = torch.log_softmax(scaled, dim=-1).gather(1, token[:, None]).squeeze(1)
    column = active.t.clamp(max=active.tokens.shape[1] - 1)  # a finished row kept decoding under FSDP: past its end
    active.tokens[active.rows, column] = token
    active.log_probs[active.rows, column] = torch.where(active.unfinished, chosen, 0.0)
    active.t += 1
    active.unfinished &= ~torch.isin(token, s.eos) & (active.t < s.max_new_tokens)
    active.token = token


class _Scheduler:
    """Admission and refill for `sample`: which prompt groups decode in which rows, and when finished rows leave.

    It owns the decoder (a `LeanDecoder` sized for `capacity` rows, or the model's own forward,
    `_ModelSteps`) and the active rows (`_Rows`). `admit` prefills pending prompt groups into free
    rows: when no row decodes, or, with refill, when at least `admit_at` rows are free (each prefill
    reads every weight once, so a few free rows are not worth one). `retire` counts a step and, at a
    check, drops the rows that finished (swap-remove).
    """

    def __init__(self, model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, n: int,
                 s: _Sampling, max_rows: int | None, every: int, lean: bool, continuous: bool, sharded: bool):
        u = input_ids.shape[0]
        self.model, self.input_ids, self.attention_mask, self.n, self.every = model, input_ids, attention_mask, n, every
        self.capacity = (u if max_rows is None else max(1, min(u, max_rows // n))) * n  # whole prompt groups
        self.width = s.max_new_tokens + every  # a finished row decodes up to every - 1 steps past its end
        self.prompt_columns = int(attention_mask.any(dim=0).sum())  # the longest prompt, unpadded
        self.max_new_tokens, self.continuous = s.max_new_tokens, continuous
        self.lean = lean and supports(model, length=self.prompt_columns + s.max_new_tokens)
        self.refill = continuous and self.lean and not sharded  # admit mid-wave: its prefill is no collective then
        self.synced = sharded and not self.lean  # every decoding step is a collective: ranks agree when to stop
        self.admit_at = max(n, self.capacity // 8)
        self.active = _Rows(u * n, self.width, s.pad_token_id, input_ids.device)
        self.decoder: LeanDecoder | _ModelSteps | None = None
        self.next_prompt = self.steps = self.since_check = 0

    @property
    def since_admission(self) -> int:
        """Steps since the last rows joined (every active row has decoded at least this many tokens)."""
        return self.steps - max(self.active.born)

    def admit(self) -> None:
        """Prefill pending prompt groups into the free rows, if no row decodes or (refill) enough rows are free."""
        b, u, n = len(self.active), self.input_ids.shape[0], self.n
        if self.next_prompt >= u or (b > 0 and not (self.refill and self.capacity - b >= self.admit_at)):
            return
        lo = self.next_prompt
        hi = lo + min((self.capacity - b) // n, u - lo)
        logits, cache, mask = _prefill(self.model, self.input_ids[lo:hi], self.attention_mask[lo:hi])
        if not self.lean:
            self.decoder = _ModelSteps(self.model, cache, mask, n, self.width)
        else:
            if self.decoder is None:  # built once per call: the weights are gathered once
                dtype = cache.layers[0].keys.dtype  # what the model's own forward computed in
                self.decoder = LeanDecoder(self.model, self.capacity, n, self.prompt_columns,
                                           self.max_new_tokens + self.every - 1, dtype, logits.device,
                                           min_rows=min(BATCH_INVARIANT_ROWS, (hi - lo) * n))
            self.decoder.add(cache, mask, n)
        del cache
        self.active.extend(logits.repeat_interleave(n, dim=0) if n > 1 else logits, lo * n, (hi - lo) * n, self.steps)
        self.next_prompt = hi

    def retire(self) -> bool:
        """Count the step just taken; at a check, drop the rows that finished. False once every prompt is done."""
        self.steps += 1
        self.since_check += 1
        if self.since_admission >= self.max_new_tokens:  # every row reached the limit: finished, no need to look
            alive = [False] * len(self.active)
        elif self.since_check >= self.every:
            alive = self.active.unfinished.tolist()
        else:
            return True
        self.since_check = 0
        any_alive = _any_unfinished(torch.tensor(any(alive)), self.synced) if self.synced else any(alive)
        if not self.continuous:
            alive = [any_alive] * len(alive)  # a static wave ends with its slowest row
        elif not self.lean and any_alive:
            # the model's forward keeps finished rows: a batch of at least BATCH_INVARIANT_ROWS rows (or all
            # of them), and under FSDP at least one row while another rank's rows still decode
            floor = min(BATCH_INVARIANT_ROWS, len(alive))
            for i in [i for i, a in enumerate(alive) if not a][: max(0, floor - sum(alive))]:
                alive[i] = True
        if not all(alive):
            keep = _swap_remove(alive)
            self.decoder.select(keep)
            self.active.keep(keep)
        return len(self.active) > 0 or self.next_prompt < self.input_ids.shape[0]


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
    allows it, admits pending prompt groups into the free slots (`_Scheduler`); without it,
    prompts are decoded in static waves of `max_rows` rows, each until its slowest row ends.
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
    every = check_every or default_check_every(device)
    if every < 1:
        raise ValueError(f"sample: check_every must be >= 1 (or None for the device default), got {check_every}")
    if max_rows is not None and max_rows < 1:
        raise ValueError(f"sample: max_rows must be >= 1 (or None: all rows at once), got {max_rows}")
    sharded = _sharded(model)
    if sharded:
        _check_equal_across_ranks(input_ids.shape[0], "prompts", device)
    if input_ids.shape[0] == 0:
        empty = torch.zeros((0, 0), dtype=torch.long, device=device)
        return empty, empty.float()
    s = _Sampling(temperature, top_k, top_p, logprob_temperature, min_new_tokens, max_new_tokens,
                  torch.tensor(eos_token_ids, device=device), pad_token_id)
    scheduler = _Scheduler(model, input_ids, attention_mask, n, s, max_rows, every, lean, continuous, sharded)
    active = scheduler.active
    while True:
        scheduler.admit()
        _sample_step(active, s, scheduler.since_admission)
        if not scheduler.retire():
            break
        if len(active):
            active.logits = scheduler.decoder.step(active.token).float()
    r = decoded_length(active.tokens, s.eos, max_new_tokens)
    return active.tokens[:, :r], active.log_probs[:, :r]
