"""DAPO pieces (Yu et al. 2025, "DAPO", arXiv:2503.14476): overlong reward shaping and
dynamic sampling. (Clip-higher is `PPOClipLoss(clip_high=0.28)`, token-level loss is the
`token_mean` aggregation.)

Notation: B batch; group_ids (B,) int64, equal for samples of the same prompt.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor

from rlhf.algos.groups import group_by


def overlong_penalty(
    response_lengths: Tensor,
    max_new_tokens: int,
    overlong_buffer_len: int,
    penalty_factor: float = 1.0,
) -> Tensor:
    """DAPO soft overlong punishment, added to the sequence reward:

        L_exp = max_new_tokens - overlong_buffer_len
        R_len = -penalty_factor * clip((|y| - L_exp) / overlong_buffer_len, 0, 1)

    i.e. 0 up to L_exp tokens, then linear down to -penalty_factor at max_new_tokens
    (and beyond: truncated responses get the full penalty).
    response_lengths: (B,) number of response tokens. max_new_tokens: the generation limit
    (DAPO's L_max, verl's `data.max_response_length`). overlong_buffer_len: width of the
    linear ramp (DAPO: 4096 of 20480). penalty_factor: the penalty at the limit.
    Returns (B,) float32, <= 0.
    """
    if overlong_buffer_len <= 0 or overlong_buffer_len > max_new_tokens:
        raise ValueError(
            f"need 0 < overlong_buffer_len <= max_new_tokens={max_new_tokens}, got {overlong_buffer_len}"
        )
    expected = max_new_tokens - overlong_buffer_len
    excess = (response_lengths.to(torch.float32) - expected) / overlong_buffer_len
    return -penalty_factor * excess.clamp(0.0, 1.0)


def groups_with_variance(group_ids: Tensor, scores: Tensor) -> Tensor:
    """DAPO dynamic sampling filter: (B,) bool, True for samples whose group's scores are not
    all equal (a group of identical rewards has zero GRPO advantage and no gradient).

    group_ids: (B,) int64. scores: (B,) sequence rewards. Singleton groups are False.
    """
    groups = group_by(group_ids)
    s = scores.to(torch.float64)
    return groups.broadcast(groups.amax(s) > groups.amin(s))


def _select_rows(payload: Any, rows: Tensor) -> Any:
    if isinstance(payload, Tensor):
        return payload[rows]
    if isinstance(payload, Mapping):
        return {k: _select_rows(v, rows) for k, v in payload.items()}
    return payload.index(rows)  # e.g. rlhf.batch.Batch


def _concat(parts: list[Any]) -> Any:
    first = parts[0]
    if isinstance(first, Tensor):
        return torch.cat(parts)
    if isinstance(first, Mapping):
        return {k: _concat([p[k] for p in parts]) for k in first}
    return type(first).concat(parts)  # e.g. rlhf.batch.Batch.concat


class DynamicSamplingAccumulator:
    """Keeps the groups with reward variance from successive generation rounds until
    `target_num_groups` groups are collected (DAPO dynamic sampling), giving up after
    `max_attempts` rounds.

        acc = DynamicSamplingAccumulator(target_num_groups=512, max_attempts=10)
        while not acc.ready:
            batch = generate_and_score(...)
            acc.add(batch, batch["group_ids"], scores)
        train_batch = acc.result()          # exactly 512 groups, in arrival order

    target_num_groups: groups (prompts) wanted for one training step.
    max_attempts: generation rounds allowed; `ready` becomes True when they are used up.
    select, concat: how to take rows of a payload and join payloads. The defaults handle a
        Tensor, a dict of tensors, or an object with `.index(rows)` and `type(p).concat(parts)`
        (the framework's Batch).
    Group ids only need to be consistent within one `add`; groups are never merged across
    rounds. `state_dict`/`load_state_dict` are not provided: the accumulator lives within
    one step.
    """

    def __init__(
        self,
        target_num_groups: int,
        max_attempts: int = 10,
        select: Callable[[Any, Tensor], Any] = _select_rows,
        concat: Callable[[list[Any]], Any] = _concat,
    ):
        if target_num_groups <= 0 or max_attempts <= 0:
            raise ValueError("target_num_groups and max_attempts must be positive")
        self.target_num_groups = target_num_groups
        self.max_attempts = max_attempts
        self.select = select
        self.concat = concat
        self.reset()

    def reset(self) -> None:
        """Forget everything (start a new training step)."""
        self.attempts = 0
        self._parts: list[tuple[Any, Tensor, Tensor]] = []  # (payload, kept rows, their group ids)

    @property
    def num_groups(self) -> int:
        """Groups with reward variance collected so far."""
        return sum(int(torch.unique(g).numel()) for _, _, g in self._parts)

    @property
    def done(self) -> bool:
        """True once at least target_num_groups groups are collected."""
        return self.num_groups >= self.target_num_groups

    @property
    def ready(self) -> bool:
        """True when done or out of attempts: stop generating."""
        return self.done or self.attempts >= self.max_attempts

    def add(self, payload: Any, group_ids: Tensor, scores: Tensor) -> int:
        """Record one generation round; returns the number of groups it contributed.

        payload: the round's samples (B rows). group_ids, scores: (B,).
        Raises RuntimeError when called after `max_attempts` rounds.
        """
        if self.attempts >= self.max_attempts:
            raise RuntimeError(
                f"dynamic sampling: {self.max_attempts} generation rounds gave {self.num_groups} of "
                f"{self.target_num_groups} groups with reward variance; raise max_attempts or the batch size"
            )
        self.attempts += 1
        rows = groups_with_variance(group_ids, scores).nonzero().squeeze(-1)
        if rows.numel() == 0:
            return 0
        self._parts.append((payload, rows, group_ids[rows]))
        return int(torch.unique(group_ids[rows]).numel())

    def result(self, allow_partial: bool = False) -> Any:
        """The kept rows of all rounds, trimmed to the first target_num_groups groups (in
        order of arrival; a round's groups in order of first appearance).

        allow_partial: return what was collected when fewer groups than the target were
        found (otherwise RuntimeError); None if nothing was kept.
        """
        if not self.done and not allow_partial:
            raise RuntimeError(f"only {self.num_groups} of {self.target_num_groups} groups collected")
        chunks = []
        remaining = self.target_num_groups
        for payload, rows, gids in self._parts:
            if remaining <= 0:
                break
            _, inverse = torch.unique(gids, return_inverse=True)
            n = int(inverse.max()) + 1
            position = torch.arange(gids.numel(), device=gids.device)
            first_seen = torch.full((n,), gids.numel(), dtype=torch.long, device=gids.device)
            first_seen = first_seen.scatter_reduce(0, inverse, position, reduce="amin")
            taken = torch.argsort(first_seen)[:remaining]
            keep = torch.isin(inverse, taken)
            chunks.append(self.select(payload, rows[keep]))
            remaining -= int(taken.numel())
        return self.concat(chunks) if chunks else None
