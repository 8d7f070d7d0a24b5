"""The agent loop: the rollout producer of multi-turn RL, and its metrics.

`AgentRollout(environment=..., tokenizer=..., parser=...)` is what `RLTrainer(rollout=...)` and
`Evaluator(rollout=...)` call in place of a single `generate`: for each of the step's rows
(n per prompt) it starts one environment instance and one trajectory, then runs turns until every
conversation has ended:

    generate one assistant turn for every live conversation   (one `policy.generate` on token ids)
    append the sampled ids verbatim; parse tool calls
    step every environment concurrently (bounded by `step_timeout_s`)
    append the observations as the chat template renders them

Engines stay unaware of turns: each turn is one ordinary `generate` call on token ids, sharded
over the policy's data-parallel ranks like any rollout, so every rank runs the same number of
calls and the ranks agree when each conversation ends (no rank waits in a collective for another).
A conversation ends when its environment says so, at `max_turns`, at the token budget
`max_response_tokens`, when a turn is cut by `sampling.max_new_tokens` before its end-of-turn
token, or when its environment raises or times out, returns a reward or an info value that is not a
finite number, or raises SystemExit or KeyboardInterrupt (that rollout's loss mask is zeroed,
`agent/env_errors` counts it and one warning line names it; the other rollouts go on). A start
(reset's messages, rendered) longer than `max_prompt_length` tokens is dropped as `PromptDataset`
drops a longer single-turn prompt (`agent/prompts_too_long`): every turn's input then stays within
`max_prompt_length + max_response_tokens`, the same bound as a single-turn prompt and response.
Tokens past a limit are never appended; with `mask_truncated` a conversation a limit cut off is
kept out of the loss altogether (its mask zeroed, as DAPO's overlong filtering does for single
responses).
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
import math
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from rlhf.agents.batch import trajectory_batch
from rlhf.agents.environment import Action, EnvironmentFactory, StepResult
from rlhf.agents.parsers import HermesParser, ParsedTurn, ToolCallParser
from rlhf.agents.trajectory import ChatRenderer, Trajectory
from rlhf.batch import Batch
from rlhf.data.tokenize import left_pad
from rlhf.ranges import PositiveInt
from rlhf.rollout.engine import position_ids_from_mask
from rlhf.rollout.sampling import SamplingParams

log = logging.getLogger(__name__)

Generate = Callable[[Batch, SamplingParams], Batch]  # an engine's or a policy group's `generate`

FINISH_REASONS = ("done", "max_turns", "max_tokens", "length", "error", "prompt_too_long")


class AgentRollout:
    """Multi-turn rollouts against one environment instance per sample (see the module docstring)."""

    def __init__(
        self,
        environment: EnvironmentFactory,  # called once per rollout, e.g. fdl.Partial(ToolEnvironment, tools=[add])
        tokenizer: PreTrainedTokenizerBase,  # the policy's (its chat template renders the observations)
        parser: ToolCallParser = HermesParser(),  # the model family's tool-call format
        max_turns: PositiveInt = 4,  # assistant turns per conversation
        max_prompt_length: PositiveInt = 512,  # tokens of the rendered start; longer: dropped (as PromptDataset)
        max_response_tokens: PositiveInt = 256,  # tokens after the prompt, sampled and observed, per conversation
        max_observation_chars: PositiveInt | None = 2000,  # each observation message's content is cut to this
        step_timeout_s: float | None = 60.0,  # limit of one reset / step / close of an environment
        max_concurrent_steps: PositiveInt = 64,  # environment calls running at once
        eos_token_ids: Sequence[int] | None = None,  # where the engine stops a turn; None: the tokenizer's EOS
        mask_truncated: bool = False,  # zero the loss mask of conversations a limit cut off (overlong filtering)
        # sample each turn in chunks of this many tokens, one generate call each: with partial rollouts the
        # producer loads newer weights between chunks, so one long turn no longer holds a batch (None: a turn is
        # one generate call). Each chunk re-reads the conversation so far: more prefill, the same tokens
        turn_chunk_tokens: PositiveInt | None = None,
    ):
        self.environment = environment
        self.tokenizer = tokenizer
        self.parser = parser
        self.max_turns = max_turns
        self.max_prompt_length = max_prompt_length
        self.max_response_tokens = max_response_tokens
        self.max_observation_chars = max_observation_chars
        self.step_timeout_s = step_timeout_s
        self.max_concurrent_steps = max_concurrent_steps
        self.eos_token_ids = list(eos_token_ids) if eos_token_ids is not None else [tokenizer.eos_token_id]
        self.mask_truncated = mask_truncated
        self.turn_chunk_tokens = turn_chunk_tokens
        self._warned_tools = False  # the template-ignores-tools warning is given once per rollout producer

    # ------------------------------------------------------------ producer
    def __call__(self, policy, prompts: Batch, sampling: SamplingParams) -> tuple[Batch, dict[str, float]]:
        """The rollout of `prompts` (n conversations each, adjacent) by a policy worker group, and its metrics.

        The engine stays awake between turns and sleeps once the conversations have ended.
        """
        try:
            return self.rollout(lambda batch, turn: policy.generate(batch, turn, keep_awake=True), prompts, sampling)
        finally:
            policy.sleep_engine()

    def rollout(self, generate: Generate, prompts: Batch, sampling: SamplingParams) -> tuple[Batch, dict[str, float]]:
        """The same with any `generate` (an engine's: tests, the gateway, evaluation)."""
        records, fallback_prompts = prompt_records(prompts, sampling.n)
        start = time.perf_counter()
        trajectories, env_seconds = _run(self._conversations(generate, records, fallback_prompts, sampling))
        batch = trajectory_batch(trajectories, Batch.from_rows(records, prompts.meta), self.tokenizer.pad_token_id,
                                 sampling.logit_temperature, self.max_response_tokens)
        metrics = agent_metrics(trajectories)
        metrics["timing_s/env"] = env_seconds
        metrics["timing_s/agent_loop"] = time.perf_counter() - start
        return batch, metrics

    # ---------------------------------------------------------------- loop
    async def _conversations(
        self, generate: Generate, records: list[dict], fallback_prompts: list[list[int]], sampling: SamplingParams
    ) -> tuple[list[Trajectory], float]:
        limit = asyncio.Semaphore(self.max_concurrent_steps)
        clock = Clock()
        conversations = await self.open_conversations(records, fallback_prompts, limit, clock)
        chunks = -(-sampling.max_new_tokens // self.turn_chunk_tokens) if self.turn_chunk_tokens else 1
        try:
            for _ in range(self.max_turns * chunks):  # every pass samples a turn, or a chunk of one
                if all(c.trajectory.finished for c in conversations):
                    break
                await self.advance(generate, conversations, sampling, limit, clock)
        finally:
            await self.close_conversations(conversations, limit)
        return [c.trajectory for c in conversations], clock.seconds

    async def open_conversations(self, records: list[dict], fallback_prompts: list[list[int]],
                                 limit: asyncio.Semaphore, clock: Clock) -> list[Conversation]:
        """One environment instance and trajectory per record (a sample's row columns), reset concurrently."""
        envs = [_Isolated(self.environment()) for _ in records]
        started = await asyncio.gather(*(self._reset(env, row, limit, clock) for env, row in zip(envs, records)))
        trajectories, renderers = self._start(started, fallback_prompts, records)
        return [Conversation(*parts) for parts in zip(envs, trajectories, renderers, records)]

    async def advance(self, generate: Generate, conversations: Sequence[Conversation], sampling: SamplingParams,
                      limit: asyncio.Semaphore, clock: Clock) -> None:
        """One assistant turn (or, with `turn_chunk_tokens`, the next chunk of one) for every live one of
        `conversations` (one `generate` call), then one environment step for each whose turn ended, concurrently.
        Each conversation counts its own turns (partial rollouts mix ages)."""
        live = [c for c in conversations if not c.trajectory.finished]
        if not live:
            return
        self._generate_turn(generate, [c.trajectory for c in live], [c.renderer for c in live], sampling)
        acting = [c for c in live if not c.trajectory.finished and not c.trajectory.turn_paused]
        results = await asyncio.gather(*(
            self._step(c.env, self._action(c.trajectory, len(c.trajectory.turns)), limit, clock) for c in acting))
        for c, (result, error) in zip(acting, results):
            turn = len(c.trajectory.turns)
            try:
                self._apply(c.trajectory, c.renderer, result, error, last_turn=turn >= self.max_turns)
            except Exception as err:  # what the environment returned broke this rollout, not the others
                _fail(c.trajectory, f"step {turn}: {_one_line(err)}", c.record)

    async def close_conversations(self, conversations: Sequence[Conversation], limit: asyncio.Semaphore) -> None:
        """Close their environments and settle how each ended (a masked loss where an error or a limit cut it)."""
        open_ones = [c for c in conversations if not c.closed]
        for c in open_ones:
            c.closed = True
        await asyncio.gather(*(self._close(c.env, limit) for c in open_ones))
        truncated = ("max_turns", "max_tokens", "length") if self.mask_truncated else ()
        for c in open_ones:
            t = c.trajectory
            t.finish("max_turns")
            if t.finish_reason in ("error", "prompt_too_long") or t.finish_reason in truncated:
                t.loss_mask = [0] * len(t.loss_mask)

    def _start(self, started: list, fallback_prompts: list[list[int]], records: list[dict]
               ) -> tuple[list[Trajectory], list[ChatRenderer]]:
        """Each conversation's start from its reset; a failed reset or an overlong start begins (and ends)
        from the dataset's prompt instead, with an empty response."""
        trajectories, renderers = [], []
        for (messages, schemas, error), prompt, row in zip(started, fallback_prompts, records):
            renderer = ChatRenderer(self.tokenizer, schemas, self.eos_token_ids)
            trajectory, reason = None, "error"
            if error is None:
                try:
                    trajectory = Trajectory.start(renderer, messages, self.max_response_tokens)
                    self._warn_if_tools_ignored(renderer, messages)
                except Exception as err:  # a template that cannot render the environment's messages
                    error = f"reset: {_one_line(err)}"
            if trajectory is not None and len(trajectory.prompt_ids) > self.max_prompt_length:
                error, reason = (f"reset: the environment's prompt has {len(trajectory.prompt_ids)} tokens, over "
                                 f"max_prompt_length={self.max_prompt_length}; dropped"), "prompt_too_long"
                log.warning("rollout of row %s: %s", row.get("uid"), error)
            if error is not None:
                trajectory = Trajectory(prompt, [], self.max_response_tokens)
                trajectory.info["env_error"] = error
                trajectory.finish(reason)
            trajectories.append(trajectory)
            renderers.append(renderer)
        return trajectories, renderers

    def _warn_if_tools_ignored(self, renderer: ChatRenderer, messages: list) -> None:
        """One warning when the environment offers tool schemas that the chat template never writes (the case
        `rlhf serve` refuses with a 400): the policy sees no tools unless the prompt describes them."""
        if self._warned_tools or not renderer.ignores_tools(messages):
            return
        self._warned_tools = True
        names = ", ".join(str((t.get("function") or t).get("name", "?")) for t in renderer.tools)
        log.warning("the chat template ignores `tools` (%s): the policy never sees their schemas. Describe them in "
                    "a system prompt (ToolEnvironment(system_prompt=...)), teach them by SFT, or set a "
                    "tokenizer.chat_template that renders tools", names)

    def _generate_turn(
        self, generate: Generate, live: list[Trajectory], renderers: list[ChatRenderer], sampling: SamplingParams
    ) -> None:
        """One assistant turn for every live conversation, in one `generate` call on their token ids; with
        `turn_chunk_tokens`, at most that many tokens of it, a paused turn continuing where its last chunk ended."""
        turn_left = [sampling.max_new_tokens - _paused_length(t) for t in live]  # each turn's own budget
        budget = min(max(min(k, t.room) for k, t in zip(turn_left, live)),
                     self.turn_chunk_tokens or sampling.max_new_tokens)
        turn = dataclasses.replace(sampling, n=1, max_new_tokens=max(budget, 1))
        out = generate(_prompt_batch([t.all_ids for t in live], self.tokenizer.pad_token_id), turn)
        lengths = out["response_mask"].sum(dim=1).tolist()
        versions = out["policy_version"].tolist() if "policy_version" in out else [None] * len(live)  # async rollout
        for row, (t, renderer) in enumerate(zip(live, renderers)):
            n = min(int(lengths[row]), turn_left[row])  # past the token budget: add_sampled cuts and ends it
            ids, log_probs = out["responses"][row, :n].tolist(), out["rollout_log_probs"][row, :n].tolist()
            if t.turn_paused:
                t.continue_sampled(renderer, ids, log_probs, version=versions[row])
            else:
                t.add_sampled(renderer, ids, log_probs, temperature=turn.logit_temperature, version=versions[row])
            if t.turn_stopped or t.finished:
                continue
            if self.turn_chunk_tokens and int(lengths[row]) >= budget and n < turn_left[row] and t.room > 0:
                t.turn_paused = True  # stopped at the chunk's budget with room left: the next pass continues it
            else:  # cut by max_new_tokens before its end-of-turn token: nothing can follow
                t.finish("length")

    def _action(self, t: Trajectory, turn: int) -> Action:
        text = t.messages[-1]["content"]
        try:
            parsed = self.parser.parse(text)
        except Exception as err:  # a parser that breaks on this turn: the turn is a malformed call
            parsed = ParsedTurn(text, (), (f"the turn could not be parsed ({_one_line(err)})",))
        if parsed.errors:
            t.count("tool_errors/parse", len(parsed.errors))
        return Action(text=text, content=parsed.content, calls=parsed.calls, errors=parsed.errors, turn=turn)

    def _apply(self, t: Trajectory, renderer: ChatRenderer, result: StepResult | None, error: str | None,
               last_turn: bool) -> None:
        if error is not None:
            t.info["env_error"] = error
            t.finish("error")
            return
        if result.reward is not None:
            reward = _number(result.reward)
            if reward is None or not math.isfinite(reward):
                kind = "a finite number" if reward is not None else "a number"
                raise ValueError(f"reward {_clip_repr(result.reward)} is not {kind}")
            t.rewards.append(reward)
        counts = {}
        for key, value in dict(result.info).items():
            counts[key] = _number(value)
            if counts[key] is None:
                raise TypeError(f"info[{key!r}] = {_clip_repr(value)} is not a number")
        for key, value in counts.items():
            t.count(key, value)
        if result.done:
            t.finish("done")
            return
        if last_turn or not result.messages:
            t.finish("max_turns" if last_turn else "done")
            return
        messages = [self._clip(m) for m in result.messages]
        try:
            t.add_messages(renderer, messages)
        except Exception as err:  # the template refused the observation: this rollout cannot go on
            t.info["env_error"] = f"{type(err).__name__}: {err}"
            t.finish("error")
            return
        if t.room <= 0:
            t.finish("max_tokens")

    def _clip(self, message: Mapping[str, Any]) -> dict:
        content = message.get("content")
        limit = self.max_observation_chars
        if limit is None or not isinstance(content, str) or len(content) <= limit:
            return dict(message)
        return {**message, "content": content[:limit] + f"... (truncated: {len(content) - limit} more characters)"}

    # ------------------------------------------------- environment calls
    async def _reset(self, env: _Isolated, row: Mapping, limit: asyncio.Semaphore, clock: Clock):
        """(messages, tool schemas or None, error or None)."""
        try:
            async with limit, clock:
                messages = await env.call("reset", row, timeout_s=self.step_timeout_s)
                schemas = await env.call("tool_schemas", timeout_s=self.step_timeout_s) \
                    if hasattr(env.env, "tool_schemas") else None
            return messages, schemas or None, None
        except Exception as err:
            log.warning("environment reset failed for row %s: %s", row.get("uid"), _one_line(err))
            return None, None, f"reset: {_one_line(err)}"

    async def _step(self, env: _Isolated, action: Action, limit: asyncio.Semaphore, clock: Clock):
        """(StepResult, None) or (None, what went wrong)."""
        try:
            async with limit, clock:
                result = await env.call("step", action, timeout_s=self.step_timeout_s)
        except Exception as err:
            log.warning("environment step failed at turn %d: %s", action.turn, _one_line(err))
            return None, f"step {action.turn}: {_one_line(err)}"
        if not isinstance(result, StepResult):
            return None, (f"step {action.turn}: {type(env.env).__name__}.step returned {type(result).__name__}, "
                          "not StepResult")
        return result, None

    async def _close(self, env: _Isolated, limit: asyncio.Semaphore) -> None:
        try:
            if hasattr(env.env, "close") and not env.hung:
                async with limit:
                    await env.call("close", timeout_s=self.step_timeout_s)
        except Exception as err:  # a rollout's cleanup never fails the step
            log.warning("environment close failed: %s: %s", type(err).__name__, err)
        finally:
            env.stop()


@dataclasses.dataclass
class Conversation:
    """One rollout in progress: its environment (on a thread of its own), trajectory, renderer and row."""

    env: _Isolated
    trajectory: Trajectory
    renderer: ChatRenderer
    record: dict
    closed: bool = False


def prompt_records(prompts: Batch, n: int) -> tuple[list[dict], list[list[int]]]:
    """Each sample's row columns (what its environment's reset reads) and its prompt ids without padding (the
    start of a conversation whose reset failed): `n` per prompt row, adjacent."""
    if not prompts.non_tensors:
        raise ValueError("AgentRollout: the prompts carry no row columns for the environments' reset (a "
                         "PromptDataset batch has uid, data_source, ground_truth, extra_info and raw_prompt)")
    columns = prompts.non_tensors
    records = [{k: columns[k][i] for k in columns} for i in range(len(prompts)) for _ in range(n)]
    ids = [row[m.bool()].tolist() for row, m in zip(prompts["input_ids"], prompts["attention_mask"])]
    return records, [p for p in ids for _ in range(n)]


class EnvironmentExit(Exception):
    """An environment raised SystemExit or KeyboardInterrupt: its rollout fails like any other error."""

    def __init__(self, err: BaseException):
        super().__init__(err)
        self.original = err


def _one_line(err: BaseException) -> str:
    """`Type: message` of an error (of the original one for `EnvironmentExit`), on one line."""
    err = err.original if isinstance(err, EnvironmentExit) else err
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def _number(value: Any) -> float | None:
    """`value` as a float, or None when it is not a number (a string never is, even "3")."""
    if isinstance(value, (str, bytes)):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _clip_repr(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _fail(t: Trajectory, error: str, row: Mapping) -> None:
    """End a rollout on an error of what its environment returned, with one warning line."""
    log.warning("rollout of row %s failed: %s", row.get("uid"), error)
    t.info["env_error"] = error
    t.finish("error")


class _Isolated:
    """One environment instance on a daemon thread with an event loop of its own.

    Its methods (sync, or coroutines on its own loop) run there, so an environment that blocks,
    even inside a coroutine (`time.sleep` in `async def step`), holds up only its own rollout: the
    agent loop waits for it at most its timeout, then abandons the thread (it dies with the process).
    The instance sees one loop for its whole life, so async resources made in `reset` work in `step`.
    """

    def __init__(self, env):
        self.env = env
        self.hung = False
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._serve, name=f"rlhf-env-{type(env).__name__}", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            self.loop.close()

    async def call(self, method: str, *args: Any, timeout_s: float | None) -> Any:
        async def run():
            try:
                value = getattr(self.env, method)(*args)
                return await value if inspect.isawaitable(value) else value
            except (SystemExit, KeyboardInterrupt) as err:  # the environment's own (signals reach the main thread)
                raise EnvironmentExit(err) from None  # else it ends this thread's loop: a timeout and a traceback

        future = asyncio.run_coroutine_threadsafe(run(), self.loop)
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), timeout_s)
        except TimeoutError:
            self.hung = True
            raise TimeoutError(f"no answer within {timeout_s:g} s") from None

    def stop(self) -> None:
        """End the thread: what still runs on its loop (an abandoned coroutine) is cancelled first."""

        def shutdown() -> None:
            for task in asyncio.all_tasks(self.loop):
                task.cancel()
            self.loop.call_soon(self.loop.stop)  # after the cancellations have run

        try:
            self.loop.call_soon_threadsafe(shutdown)
        except RuntimeError:  # closed meanwhile
            pass


class Clock:
    """Wall seconds during which at least one environment call ran (`timing_s/env`)."""

    def __init__(self):
        self.seconds, self._running, self._since = 0.0, 0, 0.0

    async def __aenter__(self):
        if self._running == 0:
            self._since = time.perf_counter()
        self._running += 1

    async def __aexit__(self, *exc):
        self._running -= 1
        if self._running == 0:
            self.seconds += time.perf_counter() - self._since


def _paused_length(t: Trajectory) -> int:
    """Tokens the paused last turn of `t` already holds (0 when no turn is paused)."""
    return t.turns[-1][1] - t.turns[-1][0] if t.turn_paused else 0


def _prompt_batch(ids: Sequence[Sequence[int]], pad_token_id: int) -> Batch:
    input_ids, mask = left_pad(ids, pad_token_id)
    return Batch({"input_ids": input_ids, "attention_mask": mask, "position_ids": position_ids_from_mask(mask)})


def _run(coroutine):
    """Run the loop's coroutine to the end in a fresh event loop (the trainer is synchronous)."""
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(coroutine)
    finally:
        loop.close()


def agent_metrics(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """`num_turns/*`, `tool_calls/*`, `tool_errors/*`, `response_length/turn_<k>/mean`, `agent/*`, `info/*` of
    one rollout."""
    n = max(len(trajectories), 1)
    turns = [len(t.turns) for t in trajectories]
    calls = [t.info.get("tool_calls", 0) + t.info.get("tool_errors/parse", 0) for t in trajectories]
    errors: dict[str, float] = defaultdict(float)
    for t in trajectories:
        for key, value in t.info.items():
            if key.startswith("tool_errors/"):
                errors[key] += value
    total_errors = sum(errors.values())
    metrics = {
        "num_turns/mean": sum(turns) / n, "num_turns/max": float(max(turns, default=0)),
        "num_turns/min": float(min(turns, default=0)),
        "tool_calls/mean": sum(calls) / n, "tool_calls/max": float(max(calls, default=0)),
        "tool_calls/total": float(sum(calls)),
        "tool_errors/total": total_errors,
        "tool_errors/rate": total_errors / sum(calls) if sum(calls) else 0.0,
        **dict(sorted(errors.items())),
        "agent/env_errors": float(sum(t.finish_reason == "error" for t in trajectories)),
        "agent/prompts_too_long": float(sum(t.finish_reason == "prompt_too_long" for t in trajectories)),
        "agent/template_fallbacks": float(sum(t.template_fallbacks for t in trajectories)),
    }
    for reason in FINISH_REASONS:
        metrics[f"agent/finish/{reason}"] = sum(t.finish_reason == reason for t in trajectories) / n
    per_turn: dict[int, list[int]] = defaultdict(list)
    for t in trajectories:
        for k, (start, end) in enumerate(t.turns, start=1):
            per_turn[k].append(end - start)
    for k, lengths in sorted(per_turn.items()):
        metrics[f"response_length/turn_{k}/mean"] = sum(lengths) / len(lengths)
    rewards = [t.reward for t in trajectories if t.reward is not None]
    metrics["agent/no_reward"] = float(len(trajectories) - len(rewards))
    if rewards:
        metrics["agent/env_reward/mean"] = sum(rewards) / len(rewards)
    metrics.update(info_metrics(trajectories))
    return metrics


BUILT_IN_INFO = ("tool_calls", "tool_errors/", "env_error")  # info keys agent_metrics reports under their own names


def info_metrics(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """`info/<key>/{mean,total}` of every other numeric `info` counter (an environment's `StepResult.info`,
    the gateway's flags), the mean over all conversations (0 where one has none)."""
    totals: dict[str, float] = defaultdict(float)
    for t in trajectories:
        for key, value in t.info.items():
            if not key.startswith(BUILT_IN_INFO) and isinstance(value, (int, float)) and not isinstance(value, bool):
                totals[key] += value
    n = max(len(trajectories), 1)
    out = {}
    for key, total in sorted(totals.items()):
        out[f"info/{key}/mean"], out[f"info/{key}/total"] = total / n, total
    return out
