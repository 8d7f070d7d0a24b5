"""DAPO's dynamic sampling on the driver: generate rounds until the step has enough prompts whose
samples got different rewards (a group of equal rewards has zero advantage and no gradient).

The filter and the bookkeeping are `rlhf.algos.DynamicSamplingAccumulator`; this adds what a
training step needs around it: fresh prompts each round, group ids that cannot collide across
rounds, and a batch of fixed size. When the rounds run out before the target (verl raises
there), the batch is filled up with groups without reward spread from the rounds, so the update
keeps its size (the batch arithmetic and the split over data-parallel workers stay valid); the
metric `dynamic_sampling/filled_groups` says how many.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from rlhf.algos import DynamicSamplingAccumulator, group_ids_from_uids, groups_with_variance
from rlhf.batch import Batch


PROMPT_COLUMNS = ("prompts",)  # (B, P), left-padded
SEQUENCE_COLUMNS = ("input_ids", "attention_mask", "position_ids")  # (B, P + R): prompt then response
# every other 2-D tensor column is (B, T), right-padded: responses, masks, log-probs, token scores


def concat_rollouts(parts: list[Batch]) -> Batch:
    """Rows of rollout batches whose prompt widths P and response widths R differ (rounds of
    generation): prompts are left-padded and responses right-padded to the widest, so the
    response still starts at column P of `input_ids` in every row. Padding is 0 (masked)."""
    P = max(p["prompts"].shape[1] for p in parts)
    R = max(p["responses"].shape[1] for p in parts)
    aligned = []
    for part in parts:
        left, right = P - part["prompts"].shape[1], R - part["responses"].shape[1]
        tensors = {}
        for key, t in part.tensors.items():
            if t.dim() != 2:
                tensors[key] = t
            elif key in PROMPT_COLUMNS:
                tensors[key] = torch.nn.functional.pad(t, (left, 0))
            elif key in SEQUENCE_COLUMNS:
                tensors[key] = torch.nn.functional.pad(t, (left, right))
            else:
                tensors[key] = torch.nn.functional.pad(t, (0, right))
        aligned.append(Batch(tensors, dict(part.non_tensors), dict(part.meta)))
    return Batch.concat(aligned)


def _first_groups(group_ids: torch.Tensor, rows: torch.Tensor, k: int) -> torch.Tensor:
    """Of `rows` (indices), those in the first `k` distinct groups by order of appearance."""
    seen: list[int] = []
    for g in group_ids[rows].tolist():
        if g not in seen:
            seen.append(g)
    keep = torch.isin(group_ids[rows], torch.tensor(seen[:k], dtype=group_ids.dtype))
    return rows[keep]


def collect_groups_with_variance(
    generate: Callable[[], Batch],  # one round: a scored batch with `uid` and `scores` (B,)
    accumulator: DynamicSamplingAccumulator,  # its target_num_groups is the step's prompts
) -> tuple[Batch, dict[str, float]]:
    """Rounds of `generate()` until `accumulator` is ready; returns exactly target groups.

    Metrics: `train/num_gen_batches` (rounds, verl's name), `dynamic_sampling/groups_with_variance`
    (found, capped at the target) and `dynamic_sampling/filled_groups` (groups without spread
    added because the rounds ran out).
    """
    accumulator.reset()
    rounds: list[tuple[Batch, torch.Tensor]] = []
    while not accumulator.ready:
        batch = generate()
        if rounds:  # the same prompt may come back in a later round: keep its groups apart
            batch["uid"] = np.array([f"{u}@round{len(rounds)}" for u in batch["uid"]], dtype=object)
        group_ids = group_ids_from_uids(batch["uid"])
        accumulator.add(batch, group_ids, batch["scores"])
        rounds.append((batch, group_ids))
    found = min(accumulator.num_groups, accumulator.target_num_groups)
    parts = [accumulator.result(allow_partial=True)] if found else []
    short = accumulator.target_num_groups - found
    for batch, group_ids in rounds:
        if short <= 0:
            break
        flat = (~groups_with_variance(group_ids, batch["scores"])).nonzero().squeeze(-1)
        rows = _first_groups(group_ids, flat, short)
        if len(rows):
            parts.append(batch.index(rows))
            short -= int(torch.unique(group_ids[rows]).numel())
    metrics = {
        "train/num_gen_batches": float(accumulator.attempts),
        "dynamic_sampling/groups_with_variance": float(found),
        "dynamic_sampling/filled_groups": float(accumulator.target_num_groups - found),
    }
    return concat_rollouts(parts), metrics
