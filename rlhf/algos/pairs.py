"""Preference pairs in a batch: chosen at row 2i, rejected at row 2i+1 (rlhf.data.preferences' layout).

Notation: P pairs, 2P rows. Shared by the reward-model loss and the DPO family.
"""

from __future__ import annotations

from torch import Tensor


def split_pairs(values: Tensor) -> tuple[Tensor, Tensor]:
    """(chosen (P, ...), rejected (P, ...)) of per-row `values` (2P, ...) laid out chosen, rejected, chosen, ..."""
    if values.shape[0] % 2:
        raise ValueError(f"preference rows come in (chosen, rejected) pairs, got an odd number of rows: "
                         f"{values.shape[0]} (a pair was split across micro-batches or ranks)")
    return values[0::2], values[1::2]
