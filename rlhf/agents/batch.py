"""Trajectories -> the `Batch` a single-turn rollout gives, so advantages, losses and aggregation need nothing new.

Columns (written by rlhf.rollout.engine.set_rollout_columns, as for single-turn rollouts): `prompts`
(B,P) left-padded prompt ids; `responses` (B,T) every token after the prompt, sampled and observed, right-padded;
`response_mask` (B,T) the LOSS MASK: 1 exactly on the tokens the policy sampled, 0 on observation
and template tokens and padding; `rollout_log_probs` (B,T) the engine's log-prob of each sampled
token, 0 elsewhere (aligned with the mask); `input_ids`, `attention_mask` (1 on every real token,
observations included: the policy is conditioned on them), `position_ids`. Under asynchronous rollout,
where the turns record the policy version that sampled them: `token_policy_version` (B,T) that version on
each sampled token, -1 elsewhere; `policy_version` (B,) the oldest of a row's turns (what its staleness is
counted against) and `policy_version_last` (B,) the newest (they differ only with partial rollouts, where a
conversation continues on newer weights). Non-tensor: the rows' columns, `response_text` (the final assistant message: what an answer scorer reads) and
`extra_info["agent"]` (the environment's reward, turns, tool counters, how it ended).

Everything downstream already reads `response_mask` as "the tokens trained on" (aggregation
counts only them; advantages and KL are zero elsewhere; multi-turn SFT batches have the same
holes), and old and reference log-probs are recomputed over the whole sequence.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from rlhf.agents.trajectory import Trajectory
from rlhf.batch import Batch, pad_rows
from rlhf.rollout.engine import set_rollout_columns


def agent_info(t: Trajectory) -> dict:
    """What a trajectory tells the reward manager and the records (`extra_info["agent"]`)."""
    return {
        "reward": t.reward,
        "num_turns": len(t.turns),
        "finish_reason": t.finish_reason,
        **{k: v for k, v in sorted(t.info.items())},
    }


def trajectory_batch(
    trajectories: Sequence[Trajectory],
    rows: Batch,  # one row per trajectory, in order: its non-tensor columns are kept
    pad_token_id: int,
    temperature: float | None,  # the log-probs' temperature (SamplingParams.logit_temperature); None: the recorded one
    max_new_tokens: int,  # the response budget (read by overlong shaping and seq_mean_token_sum_norm)
    max_model_len: int | None = None,  # the policy's context: a longer trajectory (prompt + response) is refused
) -> Batch:
    """The rollout Batch of `trajectories` (see the module docstring for its columns).

    Temperatures are per turn (`Trajectory.temperatures`, recorded by the agent loop and the gateway),
    but a batch's log-probs are recomputed at one. `temperature=None` takes the one every recorded
    turn shares (a ValueError names the turns when they differ); a turn recorded at another
    temperature than the batch's is kept out of the loss (its mask 0: its log-probs belong to
    another distribution), counted in `extra_info["agent"]["off_temperature_turns"]`.
    """
    if len(trajectories) != len(rows):
        raise ValueError(f"trajectory_batch: {len(trajectories)} trajectories for {len(rows)} rows")
    _check_lengths(trajectories, max_model_len)
    temperature = _batch_temperature(trajectories, temperature)
    masks, off = zip(*(_mask_at(t, temperature) for t in trajectories)) if trajectories else ((), ())

    def left(rows: list, pad: int) -> torch.Tensor:
        return pad_rows(rows, pad, "left", min_width=1)

    def right(rows: list, pad: int | float, dtype: torch.dtype = torch.long) -> torch.Tensor:
        return pad_rows(rows, pad, "right", dtype, min_width=1)

    out = Batch({}, dict(rows.non_tensors), dict(rows.meta))
    set_rollout_columns(
        out, prompt_ids=left([t.prompt_ids for t in trajectories], pad_token_id),
        prompt_mask=left([[1] * len(t.prompt_ids) for t in trajectories], 0),
        responses=right([t.response_ids for t in trajectories], pad_token_id),
        response_mask=right(list(masks), 0),
        response_attention=right([[1] * len(t.response_ids) for t in trajectories], 0),
        log_probs=right([t.log_probs for t in trajectories], 0.0, torch.float32),
        temperature=temperature, max_new_tokens=max_new_tokens,
    )
    if any(t.turn_versions for t in trajectories):
        _set_version_columns(out, trajectories)
    extra = rows["extra_info"] if "extra_info" in rows else [{}] * len(rows)
    out["extra_info"] = [{**(e or {}), "agent": {**agent_info(t), **({"off_temperature_turns": k} if k else {})}}
                         for e, t, k in zip(extra, trajectories, off)]
    out["response_text"] = [t.final_text for t in trajectories]
    return out


def _set_version_columns(out: Batch, trajectories: Sequence[Trajectory]) -> None:
    """`token_policy_version`, `policy_version` and `policy_version_last` from each turn's recorded version. A row
    that sampled nothing (its reset failed) holds no stale token: it takes the oldest version of the others."""
    for i, t in enumerate(trajectories):
        if len(t.turn_versions) != len(t.turns):
            raise ValueError(f"trajectory_batch: trajectory {i} records {len(t.turn_versions)} turn versions for "
                             f"{len(t.turns)} turns: every turn of an asynchronous rollout carries its version")
    width = out["responses"].shape[1]
    tokens = torch.full((len(trajectories), width), -1, dtype=torch.int64)
    for i, t in enumerate(trajectories):
        for (start, end), version in zip(t.turns, t.turn_versions):
            tokens[i, start:end] = version
        for position, version in t.continuations:  # a turn's later chunks: from where each starts to its turn's end
            if version < 0:
                continue
            end = next((e for s, e in t.turns if s <= position < e), position)
            tokens[i, position:end] = version
    known = [v for t in trajectories for v in t.versions]
    first = [min(t.versions, default=min(known)) for t in trajectories]
    last = [max(t.versions, default=min(known)) for t in trajectories]
    out["token_policy_version"] = tokens
    out["policy_version"] = torch.tensor(first, dtype=torch.int64)
    out["policy_version_last"] = torch.tensor(last, dtype=torch.int64)


def _check_lengths(trajectories: Sequence[Trajectory], max_model_len: int | None) -> None:
    """Refuse a trajectory longer than the context or than its own response budget (a corrupt record)."""
    for i, t in enumerate(trajectories):
        if max_model_len is not None and len(t.all_ids) > max_model_len:
            raise ValueError(
                f"trajectory_batch: trajectory {i} has {len(t.prompt_ids)} prompt + {len(t.response_ids)} response "
                f"tokens, over the context of {max_model_len}: the policy never saw such a sequence (drop it, or "
                "record it from a server whose context matches the policy's)")
        if len(t.response_ids) > t.max_response_tokens:
            raise ValueError(
                f"trajectory_batch: trajectory {i} has {len(t.response_ids)} response tokens, over its own "
                f"max_response_tokens={t.max_response_tokens}: the record is not one the builder wrote")


def _batch_temperature(trajectories: Sequence[Trajectory], temperature: float | None) -> float:
    if temperature is not None:
        return float(temperature)
    recorded = sorted({x for t in trajectories for x in t.temperatures})
    if len(recorded) == 1:
        return recorded[0]
    if not recorded:
        raise ValueError("trajectory_batch: the trajectories record no temperature; pass the one their log-probs "
                         "were computed at (temperature=...)")
    where = {x: next(f"trajectory {i} turn {k + 1}" for i, t in enumerate(trajectories)
                     for k, y in enumerate(t.temperatures) if y == x) for x in recorded}
    raise ValueError(
        f"trajectory_batch: the turns were sampled at several temperatures ({', '.join(f'{x:g} ({w})' for x, w in where.items())}) "
        "but a batch's log-probs are recomputed at one: pass temperature=... (turns recorded at another are kept "
        "out of the loss), or build one batch per temperature")


def _mask_at(t: Trajectory, temperature: float) -> tuple[list[int], int]:
    """The trajectory's loss mask with the turns recorded at another temperature zeroed, and how many those are."""
    off = [k for k, x in enumerate(t.temperatures[: len(t.turns)]) if not math.isclose(x, temperature)]
    if not off:
        return t.loss_mask, 0
    mask = list(t.loss_mask)
    for k in off:
        start, end = t.turns[k]
        mask[start:end] = [0] * (end - start)
    return mask, len(off)


def response_spans(tokenizer, response_ids: Sequence[int], loss_mask: Sequence[int]) -> list[tuple[str, int]]:
    """A response as runs of (text, mask value): what the policy sampled (1) and what it was shown (0).

    Each run is decoded on its own with special tokens kept, so `rlhf rollouts show` can tell the
    trained spans from the observations and see every template token.
    """
    out: list[tuple[str, int]] = []
    start = 0
    for i in range(1, len(response_ids) + 1):
        if i == len(response_ids) or int(loss_mask[i]) != int(loss_mask[start]):
            out.append((tokenizer.decode(list(response_ids[start:i]), skip_special_tokens=False),
                        int(loss_mask[start])))
            start = i
    return out
