"""Partial rollouts: multi-turn conversations that outlive the batch they were started for (docs/async.md).

Without them, the agent loop makes one step's batch at a time: every conversation of the batch runs to its end
with one set of weights, so one conversation that needs many more turns than the others holds the whole batch
(and the trainer waiting for it), while the engine runs turns of one or two rows. `PartialRollouts` keeps a
pool of prompt groups (a prompt's `n` conversations, the unit GRPO needs together) across batches instead:

    admit this batch's prompts (and, while fewer than a batch of groups are running, the next batch's)
    run turns over every running conversation of the pool, one `generate` call per turn
    emit the first `len(prompts)` groups that have ended, oldest first; the rest stay in the pool

Between turns (and between the chunks of a turn, `AgentRollout(turn_chunk_tokens=...)`) the asynchronous producer
loads the newest published weights (`AsyncRollout(partial_rollouts=True)`), so a conversation that was running at
a weight update continues on the new weights; each sampled token keeps the
log-prob and the policy version it was sampled with (`Trajectory.turn_versions`, the batch's
`token_policy_version`), and the loss's behaviour log-probs are per token already (`rollout_log_probs`).

The staleness bound holds for every trained token: a batch trained at policy version k-1 may hold no token older
than `oldest_allowed` = k-1-max_staleness (the producer sets it per batch). A group with an older token can never
be trained within the bound (the bound only rises), so it is dropped at once, running or ended, its
environments closed, and counted (`async/partial_dropped`). Dropping rather than resampling: a resample of the
same prompt would need as many turns again; AReaL bounds staleness only at admission, by capacity, and tinker's
cookbook never discards (a slow rollout is trained however stale); we keep the hard per-token bound that
`max_staleness` promises everywhere else, and count what it costs.

The pool holds at most `POOL_BATCHES` batches of groups (emitted ones leave it): that bounds how far ahead the
prompts are drawn. A checkpoint cannot hold a running environment (user code, state of its own): the groups in
the pool are restarted from their prompts on resume (`pending` / `restart`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rlhf.agents.batch import trajectory_batch
from rlhf.agents.rollout import AgentRollout, Clock, Conversation, Generate, _run, agent_metrics, prompt_records
from rlhf.batch import Batch
from rlhf.rollout.sampling import SamplingParams

POOL_BATCHES = 2  # groups kept in the pool, in batches: one batch emitted while the next runs (agent-lightning's 2x)


@dataclasses.dataclass
class Group:
    """One prompt's `n` conversations, emitted together (GRPO's group), and where they started from."""

    records: list[dict]  # each conversation's row columns
    prompt_ids: list[int]  # the prompt without padding (the start when a reset fails; restarts after a resume)
    conversations: list[Conversation]

    @property
    def ended(self) -> bool:
        return all(c.trajectory.finished for c in self.conversations)

    @property
    def oldest(self) -> int | None:
        """The oldest policy version any of its sampled tokens came from (None: nothing sampled yet)."""
        versions = [v for c in self.conversations for v in c.trajectory.versions]
        return min(versions) if versions else None


class PartialRollouts:
    """The pool of conversations carried over between batches, for one run (see the module docstring)."""

    def __init__(self, agent: AgentRollout):
        if not isinstance(agent, AgentRollout):
            raise ValueError(
                f"partial rollouts continue multi-turn conversations between turns, so they need "
                f"RLTrainer(rollout=AgentRollout(...)), not {type(agent).__name__}. A single-turn task runs as a "
                "one-turn AgentRollout(environment=ToolEnvironment, turn_chunk_tokens=...), paused between chunks; "
                "an agent program's attempt lives inside one rollout call (docs/async.md, docs/agents.md)")
        self.agent = agent
        self.groups: list[Group] = []  # in admission order
        self.oldest_allowed = 0  # the oldest policy version the next batch may hold (set per batch by the producer)
        self._restart: list[dict] = []  # groups a checkpoint held, admitted first (`restart`)
        self._meta: dict[str, Any] = {}

    def rollout(self, generate: Generate, prompts: Batch, sampling: SamplingParams,
                more_prompts: Callable[[], Batch] | None = None) -> tuple[Batch, dict[str, float]]:
        """A batch of `len(prompts)` ended groups (`sampling.n` rows each) and its metrics; `more_prompts` draws
        the next batch's prompts when the pool runs low (None: only `prompts` are admitted)."""
        started = time.perf_counter()
        self._meta = dict(prompts.meta)
        emitted, dropped, clock = _run(self._collect(generate, prompts, sampling, more_prompts))
        trajectories = [c.trajectory for g in emitted for c in g.conversations]
        records = [r for g in emitted for r in g.records]
        batch = trajectory_batch(trajectories, Batch.from_rows(records, self._meta),
                                 self.agent.tokenizer.pad_token_id, sampling.logit_temperature,
                                 self.agent.max_response_tokens)
        metrics = agent_metrics(trajectories)
        metrics.update({
            "async/partial_dropped": float(dropped * sampling.n),
            "async/carried_groups": float(len(self.groups)),
            "timing_s/env": clock.seconds,
            "timing_s/agent_loop": time.perf_counter() - started,
        })
        return batch, metrics

    async def _collect(self, generate: Generate, prompts: Batch, sampling: SamplingParams,
                       more_prompts: Callable[[], Batch] | None) -> tuple[list[Group], int, Clock]:
        wanted = len(prompts)
        limit, clock = asyncio.Semaphore(self.agent.max_concurrent_steps), Clock()
        if self._restart:
            await self._admit_records(self._restart, sampling.n, limit, clock)
            self._restart = []
        await self._admit(prompts, sampling.n, limit, clock)
        dropped = 0
        for _ in range(10_000):  # each pass runs a turn or admits prompts; a turn limit ends every conversation
            dropped += await self._drop_stale(limit)
            ended = [g for g in self.groups if g.ended]
            if len(ended) >= wanted:
                break
            running = [g for g in self.groups if not g.ended]
            if more_prompts is not None and len(running) < wanted and len(self.groups) + wanted <= POOL_BATCHES * wanted:
                await self._admit(more_prompts(), sampling.n, limit, clock)
                continue
            if not running:
                raise RuntimeError(f"partial rollouts: {len(ended)} groups ended, {wanted} wanted, none running and "
                                   "no prompts to admit (a batch of prompts smaller than the previous ones?)")
            await self.agent.advance(generate, [c for g in running for c in g.conversations], sampling, limit, clock)
        emitted = [g for g in self.groups if g.ended][:wanted]
        self.groups = [g for g in self.groups if not any(g is e for e in emitted)]
        await self.agent.close_conversations([c for g in emitted for c in g.conversations], limit)
        return emitted, dropped, clock

    async def _drop_stale(self, limit: asyncio.Semaphore) -> int:
        """Drop the groups holding a token older than `oldest_allowed`; how many."""
        stale = [g for g in self.groups if g.oldest is not None and g.oldest < self.oldest_allowed]
        if stale:
            self.groups = [g for g in self.groups if not any(g is s for s in stale)]
            await self.agent.close_conversations([c for g in stale for c in g.conversations], limit)
        return len(stale)

    async def _admit(self, prompts: Batch, n: int, limit: asyncio.Semaphore, clock: Clock) -> None:
        records, prompt_ids = prompt_records(prompts, 1)
        await self._admit_records([{"record": r, "prompt_ids": p} for r, p in zip(records, prompt_ids)], n, limit, clock)

    async def _admit_records(self, starts: Sequence[Mapping[str, Any]], n: int, limit: asyncio.Semaphore,
                             clock: Clock) -> None:
        """Start `n` conversations for each {"record", "prompt_ids"}: their row columns and unpadded prompt."""
        records = [dict(s["record"]) for s in starts for _ in range(n)]
        ids = [list(s["prompt_ids"]) for s in starts for _ in range(n)]
        conversations = await self.agent.open_conversations(records, ids, limit, clock)
        for i, s in enumerate(starts):
            self.groups.append(Group(records[i * n:(i + 1) * n], list(s["prompt_ids"]),
                                     conversations[i * n:(i + 1) * n]))

    # ------------------------------------------------------------ checkpoints
    def pending(self) -> list[dict]:
        """The groups in the pool as {"record", "prompt_ids"}, oldest first: what a checkpoint keeps to restart them
        from their prompts on resume (their environments' state cannot be saved)."""
        return [{"record": g.records[0], "prompt_ids": g.prompt_ids} for g in self.groups] + list(self._restart)

    def restart(self, starts: Sequence[Mapping[str, Any]]) -> None:
        """Admit these groups (from `pending`, read back from a checkpoint) first, at the next batch."""
        self._restart = [dict(s) for s in starts]

    def close(self) -> None:
        """Close the environments of the conversations still in the pool (the run ended)."""
        groups, self.groups = self.groups, []
        if groups:
            _run(self.agent.close_conversations([c for g in groups for c in g.conversations],
                                                asyncio.Semaphore(self.agent.max_concurrent_steps)))
