"""Micro-batches cut by a token budget: padding trimmed, rows grouped by length, or packed.

A rollout batch is padded to its longest prompt and its longest response, so with ragged
lengths (prompts 20-200 tokens, responses 5-300) most of a row-count micro-batch is padding
that the model still runs through. Here a micro-batch is cut by tokens instead (verl's
`ppo_max_token_len_per_gpu`): rows of similar length go together, and each micro-batch is
trimmed to the padding its own rows need. Per-row results are put back in the original row
order with `restore_order`. None of this changes a loss: every aggregation divides by the
GLOBAL token/sequence counts of the mini-batch (rlhf.algos.aggregation), so the sum over
micro-batches is the same however the rows are grouped (tests/workers/test_micro_batches.py
shows one AdamW step equal to the row-count path's).

Batch layout (rlhf.rollout.hf_engine): per row `input_ids`, `attention_mask`, `position_ids`
are (B, P+R) = [left-padded prompt | right-padded response]; `prompts` is (B, P);
`responses`, `response_mask` and every per-response-token column are (B, R). Columns are
told apart by width (R = responses.shape[1]); when P == R a width-P column other than
`prompts` is taken to be per-response-token.

`pack` goes further and removes padding altogether: the rows' real tokens side by side in
one (1, N) row with position ids restarting at 0 per row and no attention mask, which
transformers (5.x `masking_utils.find_packed_sequence_indices`) turns into a block-diagonal
causal mask for eager and sdpa attention, and flash attention into varlen kernels.

Notation: B rows, P prompt columns, R response columns, N real tokens, K predicted response tokens.
"""

from __future__ import annotations

import dataclasses
import heapq
from typing import NamedTuple

import numpy as np
import torch

from rlhf.batch import Batch

PROMPT_KEYS = ("prompts",)  # (B, P) columns named here are prompt-side even when P == R


# ------------------------------------------------------------------ spans
def _widths(batch: Batch) -> tuple[int, int]:
    """(P, R): prompt and response columns of `batch` (R = 0 when it has no `responses`)."""
    if "attention_mask" not in batch.tensors:
        raise KeyError(
            f"token-budget micro-batches need an `attention_mask` column (B, P+R); the batch has {sorted(batch.keys())}"
        )
    total = batch["attention_mask"].shape[1]
    r = batch["responses"].shape[1] if "responses" in batch.tensors else 0
    return total - r, r


def row_spans(batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row: columns from its first real prompt token to P, and from P to its last real response token.

    (B,) each. A micro-batch trimmed to rows i..j is max(prompt span) + max(response span)
    wide; a row's own real tokens may be fewer (a hole in the mask still counts as width).
    """
    p, _ = _widths(batch)
    mask = batch["attention_mask"] != 0
    prompt, response = mask[:, :p], mask[:, p:]
    if "response_mask" in batch.tensors:
        response = response | (batch["response_mask"] != 0)
    cols_p = torch.arange(p, device=mask.device)
    first = torch.where(prompt, cols_p, p).amin(dim=1) if p else torch.zeros(len(batch), dtype=torch.long)
    cols_r = torch.arange(1, response.shape[1] + 1, device=mask.device)
    last = torch.where(response, cols_r, 0).amax(dim=1) if response.shape[1] else torch.zeros_like(first)
    return (p - first).cpu(), last.cpu()


def row_tokens(batch: Batch) -> torch.Tensor:
    """(B,) real tokens per row (attention_mask sum): the load a row puts on a rank."""
    return batch["attention_mask"].sum(dim=1).cpu()


# --------------------------------------------------------------- trimming
def trim_padding(batch: Batch) -> Batch:
    """`batch` without the prompt columns that are left padding in every row and the response
    columns that are right padding in every row.

    Applied consistently to every (B, P+R), (B, P) and (B, R) column (any trailing dims);
    other columns, non-tensor columns and meta are kept as they are. Position ids are sliced,
    not recomputed, so every kept token keeps its position and a forward gives the same
    per-token outputs for the kept columns. At least one prompt and one response column stay
    (a forward needs the position that predicts the first response token).
    """
    p, r = _widths(batch)
    if not len(batch):
        return batch
    prompt_span, response_span = row_spans(batch)
    return _trim(batch, p, r, min(p, max(int(prompt_span.max()), 1)), min(r, max(int(response_span.max()), 1)))


def _trim(batch: Batch, p: int, r: int, keep_p: int, keep_r: int) -> Batch:
    """`batch` with its last `keep_p` of P prompt columns and first `keep_r` of R response columns."""
    if keep_p == p and keep_r == r:
        return batch
    full = slice(p - keep_p, p + keep_r)
    tensors = {}
    for name, t in batch.tensors.items():
        width = t.shape[1] if t.dim() >= 2 else None
        if width == p + r:
            t = t[:, full]
        elif width == p and (name in PROMPT_KEYS or p != r):
            t = t[:, p - keep_p :]
        elif width == r and r:
            t = t[:, :keep_r]
        tensors[name] = t
    return Batch(tensors, dict(batch.non_tensors), dict(batch.meta))


# ------------------------------------------------------- token-budget split
class MicroBatches(NamedTuple):
    """What `split_by_tokens` returns."""

    parts: list[Batch]  # trimmed micro-batches, longest rows first
    order: np.ndarray  # (B,) original row index of each row of concat(parts), in that order
    over_budget: int  # rows longer than the budget on their own (each went into a micro-batch alone)


def row_units(batch: Batch) -> list[np.ndarray]:
    """Runs of adjacent rows that belong together: the same `uid` (a GRPO group), or, without
    a `uid` column, the same prompt (the same left-padded `input_ids` and mask over P columns).

    Kept in one micro-batch (or on one rank) where possible, so a shared prompt is encoded
    once (rlhf.models.shared_prefix).
    """
    b = len(batch)
    if b == 0:
        return []
    if "uid" in batch.non_tensors:
        uid = batch.non_tensors["uid"]
        same = np.array([uid[i] == uid[i - 1] for i in range(1, b)], dtype=bool)
    elif "input_ids" in batch.tensors and "attention_mask" in batch.tensors:
        p, _ = _widths(batch)
        key = torch.cat([batch["input_ids"][:, :p], batch["attention_mask"][:, :p]], dim=1)
        same = (key[1:] == key[:-1]).all(dim=1).cpu().numpy() if p else np.zeros(b - 1, dtype=bool)
    else:
        same = np.zeros(b - 1, dtype=bool)
    starts = np.concatenate([[0], np.nonzero(~same)[0] + 1, [b]])
    return [np.arange(starts[i], starts[i + 1]) for i in range(len(starts) - 1)]


def split_by_tokens(
    batch: Batch,
    max_tokens: int,  # padded tokens (rows x trimmed width) per micro-batch
    min_micro_batches: int = 1,  # at least this many parts (FSDP: the max over ranks)
    keep_groups: bool = True,  # keep a GRPO group whole when it fits; False: place rows freely by length
    whole_units: bool = False,  # never split a unit, even over the budget (a preference pair: its loss needs both)
) -> MicroBatches:
    """Micro-batches whose padded size (rows x trimmed width) is at most `max_tokens`.

    Rows are grouped by length: units (`row_units`: a GRPO group, kept whole when it fits the
    budget, else split into rows; single rows with `keep_groups=False`) are taken longest first
    (by response, then prompt) and placed in the first micro-batch they fit (first-fit
    decreasing), each micro-batch trimmed as `trim_padding` does. A single row
    wider than the budget goes into a micro-batch alone and is counted in `over_budget`.

    `whole_units`: a unit is never split: one wider than the budget goes into a micro-batch alone (counted
    in `over_budget`), and the splitting below cuts between units only.

    `min_micro_batches`: split the micro-batches with the most rows until there are at least
    this many (never more than the rows, or with `whole_units` the units). Under FSDP every rank must run the same number of
    forwards: take the max of `len(parts)` over ranks and split again with it (verl does the same).
    Rows inside a micro-batch keep their original relative order.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be a positive number of tokens per micro-batch, got {max_tokens}")
    b = len(batch)
    if b == 0:
        return MicroBatches([], np.zeros(0, dtype=np.int64), 0)
    p, r = _widths(batch)
    prompt_span, response_span = (s.numpy() for s in row_spans(batch))
    prompt_span, response_span = np.clip(prompt_span, min(p, 1), p), np.clip(response_span, min(r, 1), r)  # as trimmed

    # Units longest response first, then longest prompt; ties in row order (a min-heap on the
    # negated spans). Responses vary most (within a group, and on the right of the layout):
    # sorting by them left ~4% less padding than by prompt + response (prompts 20-200, responses 5-300).
    def entry(rows: np.ndarray) -> tuple[int, int, int, np.ndarray]:
        return -int(response_span[rows].max()), -int(prompt_span[rows].max()), int(rows[0]), rows

    units = row_units(batch) if keep_groups or whole_units else [np.array([i]) for i in range(b)]
    pending = [entry(u) for u in units]
    heapq.heapify(pending)
    # open micro-batches: rows, widest prompt span, widest response span (first fit, vectorised)
    members: list[list[int]] = []
    n_rows, wide_p, wide_r = (np.zeros(b, dtype=np.int64) for _ in range(3))
    over_budget = 0
    while pending:
        neg_r, neg_p, _, unit = heapq.heappop(pending)
        prompt, response, n = -neg_p, -neg_r, len(unit)
        if n * (prompt + response) > max_tokens and n > 1 and not whole_units:  # too big: place its rows one by one
            for i in unit:
                heapq.heappush(pending, entry(np.array([i])))
            continue
        k = len(members)
        cost = (n_rows[:k] + n) * (np.maximum(wide_p[:k], prompt) + np.maximum(wide_r[:k], response))
        fits = np.flatnonzero(cost <= max_tokens)
        if len(fits):
            j = int(fits[0])
        else:
            j = k
            members.append([])
            over_budget += int(n * (prompt + response) > max_tokens)
        members[j].extend(int(i) for i in unit)
        n_rows[j] += n
        wide_p[j], wide_r[j] = max(wide_p[j], prompt), max(wide_r[j], response)
    unit_of = np.zeros(b, dtype=np.int64)
    for k, unit in enumerate(units):
        unit_of[unit] = k
    groups = _split_to_count([sorted(m) for m in members], min(min_micro_batches, b),
                             unit_of if whole_units else None)
    order = np.array([i for g in groups for i in g], dtype=np.int64)
    parts = [_trim(batch.index(g), p, r, int(prompt_span[g].max()), int(response_span[g].max())) for g in groups]
    return MicroBatches(parts, order, over_budget)


def _split_to_count(groups: list[list[int]], count: int, unit_of: np.ndarray | None) -> list[list[int]]:
    """Halve the micro-batch with the most rows until there are `count` (FSDP: every rank the same number of
    forwards). `unit_of` (row -> unit) given: cut only between units, at the boundary nearest the middle, and stop
    when every micro-batch is a single unit."""
    groups = list(groups)
    while len(groups) < count:
        splittable = [j for j in range(len(groups)) if unit_of is None or len(set(unit_of[groups[j]])) > 1]
        if not splittable:
            break
        i = max(splittable, key=lambda j: len(groups[j]))
        rows = groups.pop(i)
        cut = len(rows) // 2
        if unit_of is not None:
            bounds = [k for k in range(1, len(rows)) if unit_of[rows[k]] != unit_of[rows[k - 1]]]
            cut = min(bounds, key=lambda k: abs(k - len(rows) / 2))
        groups[i:i] = [rows[:cut], rows[cut:]]
    return groups


def unit_chunks(batch: Batch, rows: int) -> list[np.ndarray]:
    """Row indices of consecutive runs of whole units (`row_units`) of at most `rows` rows each (a unit
    larger than that alone): the row-count micro-batches (and mini-batches) of a batch whose units must
    not be split."""
    chunks: list[list[int]] = []
    for unit in row_units(batch):
        if chunks and len(chunks[-1]) + len(unit) <= rows:
            chunks[-1].extend(unit.tolist())
        else:
            chunks.append(unit.tolist())
    return [np.asarray(c, dtype=np.int64) for c in chunks]


def restore_order(parts: list[torch.Tensor], order: np.ndarray, width: int) -> torch.Tensor:
    """Per-row results of the micro-batches, (B_i, R_i, ...) each, as one (B, width, ...) tensor
    in the original row order: right-padded with zeros to `width` (the untrimmed R), then
    rows put back where `order` says they came from."""
    padded = [torch.nn.functional.pad(t, (0, 0) * (t.dim() - 2) + (0, width - t.shape[1])) for t in parts]
    stacked = torch.cat(padded, dim=0)
    out = torch.empty_like(stacked)
    out[torch.as_tensor(order, device=stacked.device)] = stacked
    return out


# ---------------------------------------------------------------- packing
@dataclasses.dataclass
class Packed:
    """The real tokens of B rows side by side in one row, and where response predictions go."""

    input_ids: torch.Tensor  # (1, N)
    position_ids: torch.Tensor  # (1, N): each row's own positions, restarting at 0
    logits_index: torch.Tensor  # (K,): packed positions whose logits predict a response token
    targets: torch.Tensor  # (K,): the response token each of those positions predicts
    rows: torch.Tensor  # (K,): row of the prediction in the (B, R) result
    cols: torch.Tensor  # (K,): response column of the prediction
    shape: tuple[int, int]  # (B, R)


def pack(batch: Batch) -> Packed:
    """The batch's real tokens (attention_mask != 0) in one (1, N) row with restarting positions.

    Response column t of a row is predicted by the packed position of the real token before
    it (column P+t-1 when there is no hole), the same logit a padded forward uses.
    A row with no real response token contributes its tokens but no prediction.
    """
    p, r = _widths(batch)
    mask = batch["attention_mask"] != 0
    flat = mask.reshape(-1).nonzero().squeeze(1)  # flat (row * (P+R) + col) of each real token
    input_ids = batch["input_ids"].reshape(-1)[flat][None]
    position_ids = batch["position_ids"].reshape(-1)[flat][None]
    row, col = flat // (p + r), flat % (p + r)
    has_predecessor = torch.cat([torch.zeros(1, dtype=torch.bool, device=row.device), row[1:] == row[:-1]])
    is_pred = (col >= p) & has_predecessor
    target_pos = is_pred.nonzero().squeeze(1)  # packed positions of real response tokens with a predecessor
    return Packed(
        input_ids=input_ids,
        position_ids=position_ids,
        logits_index=target_pos - 1,
        targets=input_ids[0, target_pos],
        rows=row[target_pos],
        cols=col[target_pos] - p,
        shape=(len(batch), r),
    )


def packed_logits(model: torch.nn.Module, packed: Packed) -> torch.Tensor:
    """(K, V) logits of a causal LM at `packed.logits_index`.

    The cache must be off: with `use_cache=True` (the default of most configs) transformers
    skips packed-sequence detection and the rows attend to each other (measured: logits off by
    0.6 on the tiny model, silently).
    """
    out = model(
        input_ids=packed.input_ids, position_ids=packed.position_ids, attention_mask=None,
        use_cache=False, logits_to_keep=packed.logits_index,
    )
    return out.logits[0]


def unpack(values: torch.Tensor, packed: Packed) -> torch.Tensor:
    """(K, ...) per-prediction values as (B, R, ...) with zeros where no response token was predicted."""
    out = values.new_zeros((*packed.shape, *values.shape[1:]))
    out[packed.rows, packed.cols] = values
    return out
