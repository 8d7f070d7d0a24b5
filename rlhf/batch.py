"""`Batch`: the one data container that flows between driver, workers and algorithms.

Tensors share their first dimension (one row per sample); non-tensor columns are numpy
object arrays of the same length (uids, ground truths, data sources); `meta` carries
batch-level facts (sampling settings, global token counts) that are not per row.
Key names follow verl's so verl users feel at home (see docs/glossary.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

import numpy as np
import torch
from torch.nn.utils.rnn import pad_sequence


def _as_object_array(values: Any) -> np.ndarray:
    if isinstance(values, np.ndarray) and values.dtype == object and values.ndim == 1:
        return values
    out = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        out[i] = v
    return out


ROLLOUT_META = {
    "temperature": "the rollout engine (SamplingParams.logit_temperature: the temperature log-probs are "
    "computed at; 1.0 for greedy decoding), and by SFTDataset (1.0: the data's likelihood)",
    "max_new_tokens": "the rollout engine (SamplingParams.max_new_tokens: the generation limit, read by "
    "overlong shaping and seq_mean_token_sum_norm)",
}
"""Batch-level facts every rollout engine records in `meta` (rlhf.rollout.engine.rollout_batch), and where
they come from: readers get them with `Batch.require_meta`, never with a default."""


@dataclasses.dataclass
class Batch:
    """Rows of samples: `tensors` (shared first dim), `non_tensors` (object arrays), `meta`."""

    tensors: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)
    non_tensors: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        self.non_tensors = {k: _as_object_array(v) for k, v in self.non_tensors.items()}
        lengths = {k: v.shape[0] for k, v in self.tensors.items()}
        lengths.update({k: len(v) for k, v in self.non_tensors.items()})
        if len(set(lengths.values())) > 1:
            raise ValueError(f"Batch columns disagree on the number of rows: {lengths}")

    # ----------------------------------------------------------------- access
    def __len__(self) -> int:
        for v in self.tensors.values():
            return v.shape[0]
        for v in self.non_tensors.values():
            return len(v)
        return 0

    def __contains__(self, key: str) -> bool:
        return key in self.tensors or key in self.non_tensors

    def __getitem__(self, key: str) -> Any:
        if key in self.tensors:
            return self.tensors[key]
        if key in self.non_tensors:
            return self.non_tensors[key]
        raise KeyError(f"Batch has no column {key!r}; columns: {sorted(self.keys())}")

    def __setitem__(self, key: str, value: Any) -> None:
        n = len(self) if self.keys() else None
        if isinstance(value, torch.Tensor):
            if n is not None and value.shape[0] != n:
                raise ValueError(f"column {key!r} has {value.shape[0]} rows, batch has {n}")
            self.non_tensors.pop(key, None)
            self.tensors[key] = value
        else:
            arr = _as_object_array(value)
            if n is not None and len(arr) != n:
                raise ValueError(f"column {key!r} has {len(arr)} rows, batch has {n}")
            self.tensors.pop(key, None)
            self.non_tensors[key] = arr

    def keys(self) -> list[str]:
        return [*self.tensors, *self.non_tensors]

    def require_meta(self, key: str, reader: str) -> Any:
        """`meta[key]` for `reader`, or a KeyError naming what is missing and who sets it.

        No default: a batch-level fact such as the sampling temperature silently replaced by a
        guess changes log-probs without any error (see `ROLLOUT_META` for the keys engines set).
        """
        if key not in self.meta:
            setter = ROLLOUT_META.get(key, "whoever builds the batch")
            raise KeyError(
                f"{reader} needs batch.meta[{key!r}], which this batch lacks (meta keys: {sorted(self.meta)}). "
                f"It is set by {setter}; a batch built by hand must set it itself."
            )
        return self.meta[key]

    # ------------------------------------------------------------ row algebra
    def index(self, rows: torch.Tensor | np.ndarray | Sequence[int] | slice) -> Batch:
        """Rows selected by a slice, an index list or a boolean mask (meta is kept)."""
        if isinstance(rows, slice):
            idx_t, idx_np = rows, rows
        else:
            idx_np = np.asarray(rows.cpu() if isinstance(rows, torch.Tensor) else rows)
            if idx_np.dtype == bool:
                idx_np = np.nonzero(idx_np)[0]
            idx_np = idx_np.astype(np.int64).reshape(-1)
            idx_t = torch.from_numpy(idx_np)
        return Batch(
            {k: v[idx_t] for k, v in self.tensors.items()},
            {k: v[idx_np] for k, v in self.non_tensors.items()},
            dict(self.meta),
        )

    reorder = index

    def chunk(self, n: int) -> list[Batch]:
        """Split into `n` contiguous parts of equal size (len must divide; see `pad_to_multiple`)."""
        if len(self) % n:
            raise ValueError(f"cannot chunk {len(self)} rows into {n} equal parts; pad first")
        size = len(self) // n
        return [self.index(slice(i * size, (i + 1) * size)) for i in range(n)]

    def split(self, size: int) -> list[Batch]:
        """Contiguous parts of at most `size` rows (the last may be shorter)."""
        return [self.index(slice(i, i + size)) for i in range(0, len(self), size)]

    @staticmethod
    def concat(parts: Sequence[Batch]) -> Batch:
        """Rows of all parts, in order; meta comes from the first part."""
        parts = [p for p in parts if p.keys()] or list(parts[:1])
        if not parts:
            return Batch()
        keys = [set(p.keys()) for p in parts]
        if any(k != keys[0] for k in keys):
            raise ValueError(f"cannot concat batches with different columns: {keys}")
        first = parts[0]
        return Batch(
            {k: _cat_padded([p.tensors[k] for p in parts]) for k in first.tensors},
            {k: np.concatenate([p.non_tensors[k] for p in parts]) for k in first.non_tensors},
            dict(first.meta),
        )

    def union(self, other: Batch) -> Batch:
        """Columns of both; a column present in both must hold equal values."""
        if self.keys() and other.keys() and len(self) != len(other):
            raise ValueError(f"cannot union batches of {len(self)} and {len(other)} rows")
        tensors = dict(self.tensors)
        for k, v in other.tensors.items():
            if k in tensors and not torch.equal(tensors[k], v):
                raise ValueError(f"union: column {k!r} differs between the two batches")
            tensors[k] = v
        non_tensors = dict(self.non_tensors)
        for k, v in other.non_tensors.items():
            if k in non_tensors and not np.array_equal(non_tensors[k], v):
                raise ValueError(f"union: column {k!r} differs between the two batches")
            non_tensors[k] = v
        return Batch(tensors, non_tensors, {**self.meta, **other.meta})

    def repeat(self, n: int, interleave: bool = True) -> Batch:
        """Each row `n` times: `a a b b` when interleaved (samples of a group adjacent), else `a b a b`."""
        if interleave:
            idx = np.repeat(np.arange(len(self)), n)
        else:
            idx = np.tile(np.arange(len(self)), n)
        return self.index(idx)

    def select(self, keys: Iterable[str]) -> Batch:
        keys = list(keys)
        missing = [k for k in keys if k not in self]
        if missing:
            raise KeyError(f"Batch has no column(s) {missing}; columns: {sorted(self.keys())}")
        return Batch(
            {k: v for k, v in self.tensors.items() if k in keys},
            {k: v for k, v in self.non_tensors.items() if k in keys},
            dict(self.meta),
        )

    def pop(self, keys: Iterable[str]) -> Batch:
        """Remove `keys` from this batch and return them as a new batch."""
        out = self.select(keys)
        for k in out.keys():
            self.tensors.pop(k, None)
            self.non_tensors.pop(k, None)
        return out

    def pad_to_multiple(self, k: int) -> tuple[Batch, int]:
        """Append copies of the first rows so len is a multiple of `k`; returns (batch, n_padded)."""
        pad = (-len(self)) % k
        if pad == 0:
            return self, 0
        idx = np.concatenate([np.arange(len(self)), np.arange(pad) % max(len(self), 1)])
        return self.index(idx), pad

    def unpad(self, pad: int) -> Batch:
        return self if pad == 0 else self.index(slice(0, len(self) - pad))

    def to(self, device: torch.device | str) -> Batch:
        return Batch({k: v.to(device) for k, v in self.tensors.items()}, dict(self.non_tensors), dict(self.meta))

    @classmethod
    def from_rows(cls, rows: Sequence[Mapping[str, Any]], meta: Mapping[str, Any] | None = None) -> Batch:
        """Non-tensor batch from a list of dicts (all rows must share keys)."""
        keys = list(rows[0]) if rows else []
        return cls({}, {k: [r[k] for r in rows] for k in keys}, dict(meta or {}))

    def __reduce__(self) -> tuple:
        """Pickle CPU tensors as numpy arrays: the runtime ships batches between processes.

        torch's own tensor pickling goes through its storage-sharing machinery: a round trip
        of a 158 KB GRPO batch takes 2.5-3 ms that way against 0.3 ms as numpy, and a Ray call
        carrying it 8.1 ms against 3.7 ms (benchmarks/ray_dispatch.py). Numpy arrays are
        pickled as plain buffers (protocol 5 out-of-band under Ray). Dtypes numpy lacks
        (bfloat16, ...) travel as same-width integers and are viewed back.
        """
        return (_rebuild, ({k: _pack(v) for k, v in self.tensors.items()}, self.non_tensors, self.meta))

    def __repr__(self) -> str:
        t = ", ".join(f"{k}: {tuple(v.shape)} {str(v.dtype).removeprefix('torch.')}" for k, v in self.tensors.items())
        nt = ", ".join(self.non_tensors)
        return f"Batch(rows={len(self)}, tensors=[{t}], non_tensors=[{nt}], meta={sorted(self.meta)})"


def pad_rows(
    rows: Sequence[Sequence[int | float]],
    padding_value: int | float,
    side: Literal["left", "right"],
    dtype: torch.dtype = torch.long,
    min_width: int = 0,  # agents' batches keep one column even when every row is empty
) -> torch.Tensor:
    """(B, W) rows of different lengths padded to the longest (at least `min_width`): on the left for
    prompts (generation continues on the right), on the right for responses."""
    if not rows:
        return torch.full((0, min_width), padding_value, dtype=dtype)
    tensors = [torch.as_tensor(np.asarray(r), dtype=dtype) for r in rows]
    padded = pad_sequence(tensors, batch_first=True, padding_value=padding_value, padding_side=side)
    short = min_width - padded.shape[1]
    if short > 0:
        padded = torch.nn.functional.pad(padded, (short, 0) if side == "left" else (0, short), value=padding_value)
    return padded


def _cat_padded(tensors: list[torch.Tensor]) -> torch.Tensor:
    """Concatenate along dim 0; 2-D tensors of different widths are right-padded with 0."""
    if len({t.shape[1:] for t in tensors}) > 1:
        if any(t.dim() != 2 for t in tensors):
            raise ValueError(f"cannot concat tensors of shapes {[tuple(t.shape) for t in tensors]}")
        width = max(t.shape[1] for t in tensors)
        tensors = [torch.nn.functional.pad(t, (0, width - t.shape[1])) for t in tensors]
    return torch.cat(tensors, dim=0)


_NUMPY_LACKS = {torch.bfloat16: torch.int16, torch.float8_e4m3fn: torch.uint8, torch.float8_e5m2: torch.uint8}


def _pack(t: torch.Tensor) -> Any:
    """A tensor as (numpy array, torch dtype), or the tensor itself where numpy cannot hold it."""
    if t.device.type != "cpu" or t.is_sparse or t.is_quantized or t.dtype == torch.complex32:
        return t
    t = t.detach()
    if t.dtype in _NUMPY_LACKS:
        return t.view(_NUMPY_LACKS[t.dtype]).numpy(), t.dtype
    return t.numpy(), t.dtype


def _unpack(packed: Any) -> torch.Tensor:
    if isinstance(packed, torch.Tensor):
        return packed
    array, dtype = packed
    if not array.flags.writeable:  # a zero-copy view of a shared buffer: own the memory
        array = array.copy()
    t = torch.from_numpy(array)
    return t.view(dtype) if t.dtype != dtype else t


def _rebuild(tensors: dict[str, Any], non_tensors: dict[str, np.ndarray], meta: dict[str, Any]) -> Batch:
    return Batch({k: _unpack(v) for k, v in tensors.items()}, non_tensors, meta)
