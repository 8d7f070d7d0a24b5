"""Black-box agents in the RL loop: the rollout producer that runs the user's agent program.

`AgentProgramRollout(agent=run, tokenizer=tok)` is what `RLTrainer(rollout=...)` and
`Evaluator(rollout=...)` call in place of a single `generate` (the plug point multi-turn environments
use, rlhf.trainers.rollout_producer). Per call, for each prompt row and each of its `sampling.n`
attempts (the GRPO group):

    open a session on the recording gateway, on the live engine       (rlhf.agent_programs.gateway)
    await agent(task, client)   -- the user's program, its own thread and event loop, `attempt_timeout_s`
    its reward: the returned number, or the reward manager's score of the final answer
    its trajectories: what the gateway recorded, token-exactly (sampled ids verbatim, loss mask 1)

Attempts run concurrently (`max_concurrent` at once); their requests are batched into `generate` calls
by the server's scheduler. An agent that raises, hangs past its timeout, or returns something that is
not a reward costs its own attempt: its trajectories stay in the batch with the loss mask zeroed and
reward 0 (so `rlhf rollouts show` shows what the model said before it failed), it is counted
(`agent/errors/*`, `agent/timeouts`) and named in one warning line, and the step goes on.

Rows: one per trajectory. The gateway follows the agent's messages (rlhf.serve.gateway): a request that
continues a recorded conversation extends its trajectory; a second independent question, a resample
from an earlier turn, or an edited history starts another trajectory of the same session (a fork). Each
trajectory is its own row, every one with the attempt's reward and the task's uid (the GRPO group), so a
forked attempt counts once per trajectory in its group's baseline (as rLLM trains every step of an
episode with the episode's reward). An attempt that never called the model is
one row with an empty response (nothing to train; its reward still joins its group). Evaluation
(`__call__`, what `Evaluator` calls) keeps one row per attempt, its last trajectory, since held-out
metrics read `n` rows per prompt.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from rlhf.agent_programs.gateway import Generate, LiveGateway, Transport, run_in_thread
from rlhf.agent_programs.program import Outcome, attempt_function, outcome
from rlhf.agents.batch import trajectory_batch
from rlhf.agents.parsers import ToolCallParser
from rlhf.agents.rollout import agent_metrics
from rlhf.agents.trajectory import Trajectory
from rlhf.batch import Batch
from rlhf.choices import check_choice
from rlhf.ranges import PositiveInt
from rlhf.rollout.sampling import SamplingParams

log = logging.getLogger(__name__)

# agent_metrics' names that mean nothing for an agent program (they count an Environment's failures)
_ENVIRONMENT_ONLY = ("agent/env_errors", "agent/prompts_too_long", "agent/env_reward/mean")


@dataclasses.dataclass
class Attempt:
    """One run of the agent program on one task: its session, what it returned, how it ended."""

    row: int  # the prompt row
    session: str
    outcome: Outcome | None = None
    error: str | None = None  # "Type: message" of a failure
    error_kind: str | None = None  # the exception's type name, or "timeout", or "bad_return"
    trajectories: list[Trajectory] = dataclasses.field(default_factory=list)

    @property
    def failed(self) -> bool:
        return self.error is not None


class AgentProgramRollout:
    """Runs the agent program for every task x `sampling.n` attempts (see the module docstring)."""

    def __init__(
        self,
        agent: Any,  # async def run(task, client) -> float | dict | None; or a class / object with that `run`
        tokenizer: PreTrainedTokenizerBase,  # the policy's: its chat template renders the agent's messages
        tool_parser: ToolCallParser | None = None,  # the model family's call format, for `tools=`; None: refused
        max_concurrent: PositiveInt = 64,  # attempts running at once (and rows per generate call at most)
        attempt_timeout_s: float = 300.0,  # an attempt still running after this fails (agent/timeouts)
        max_prompt_length: PositiveInt = 1024,  # tokens of a conversation's first prompt ...
        max_response_tokens: PositiveInt = 1024,  # ... and trained tokens after it; a request past both gets 400
        batch_wait_ms: float = 1000.0,  # a batch waits at most this for attempts busy elsewhere (all asking: at once)
        transport: Transport = "in_process",  # the client's way to the gateway: an ASGI call, or loopback HTTP
        eos_token_ids: Sequence[int] | None = None,  # where the engine stops a turn; None: the tokenizer's EOS
    ):
        check_choice("AgentProgramRollout.transport", transport, Transport)
        self.attempt_function = attempt_function(agent)
        self.tokenizer = tokenizer
        self.tool_parser = tool_parser
        self.max_concurrent = max_concurrent
        self.attempt_timeout_s = attempt_timeout_s
        self.max_prompt_length = max_prompt_length
        self.max_response_tokens = max_response_tokens
        self.batch_wait_ms = batch_wait_ms
        self.transport = transport
        self.eos_token_ids = list(eos_token_ids) if eos_token_ids is not None else [tokenizer.eos_token_id]

    # ------------------------------------------------------------ producer
    def __call__(self, policy, prompts: Batch, sampling: SamplingParams) -> tuple[Batch, dict[str, float]]:
        """Evaluation's entry (`Evaluator`): one row per attempt (its last trajectory), the engine kept awake
        through the attempts and put to sleep after them."""
        try:
            return self._rollout(lambda batch, turn: policy.generate(batch, turn, keep_awake=True), prompts,
                                 sampling, every_trajectory=False)
        finally:
            policy.sleep_engine()

    def rollout(self, generate: Generate, prompts: Batch, sampling: SamplingParams) -> tuple[Batch, dict[str, float]]:
        """Training's entry (`RLTrainer`, synchronous or asynchronous): one row per trajectory."""
        return self._rollout(generate, prompts, sampling, every_trajectory=True)

    def _rollout(self, generate: Generate, prompts: Batch, sampling: SamplingParams,
                 every_trajectory: bool) -> tuple[Batch, dict[str, float]]:
        tasks = _tasks(prompts)
        started = time.perf_counter()
        gateway = LiveGateway(
            generate, self.tokenizer, sampling, eos_token_ids=self.eos_token_ids,
            max_prompt_length=self.max_prompt_length, max_response_tokens=self.max_response_tokens,
            tool_parser=self.tool_parser, max_batch_size=self.max_concurrent, batch_wait_ms=self.batch_wait_ms,
            timeout_s=self.attempt_timeout_s, transport=self.transport,
        )
        step = uuid.uuid4().hex[:8]
        attempts = [Attempt(row, f"{step}-{row}-{k}") for row in range(len(tasks)) for k in range(sampling.n)]
        with gateway:
            _run(self._attempts(gateway, tasks, attempts))
        if gateway.engine.errors:  # the policy's generate broke: the step fails, as a single-turn rollout's would
            err = gateway.engine.errors[0]
            err.add_note(f"(raised by the policy's generate while serving agent attempts; {len(gateway.engine.errors)} "
                         "failed calls, rlhf.agent_programs)")
            raise err
        # the gateway is closed: no late request of an abandoned attempt can change a session now
        for a in attempts:
            session = gateway.sessions.get(a.session, create=False)
            a.trajectories = list(session.trajectories) if session is not None else []
            self._settle(a, tasks[a.row])
        batch, rows_of = self._batch(attempts, prompts, sampling, every_trajectory)
        if gateway.engine.versions:  # asynchronous rollout: the weights every request of this batch came from
            batch["policy_version"] = torch.full((len(batch),), min(gateway.engine.versions), dtype=torch.int64)
            batch["policy_version_last"] = torch.full((len(batch),), max(gateway.engine.versions), dtype=torch.int64)
        metrics = self._metrics(attempts, rows_of, gateway)
        metrics["timing_s/agent_loop"] = time.perf_counter() - started
        return batch, metrics

    # ------------------------------------------------------------ attempts
    async def _attempts(self, gateway: LiveGateway, tasks: list[dict], attempts: list[Attempt]) -> None:
        limit = asyncio.Semaphore(self.max_concurrent)
        running = 0

        async def one(a: Attempt) -> None:
            nonlocal running
            async with limit:
                running += 1
                gateway.expect_requests(running)
                try:
                    await self._attempt(gateway, tasks[a.row], a)
                finally:
                    running -= 1
                    gateway.expect_requests(running)

        await asyncio.gather(*(one(a) for a in attempts))

    async def _attempt(self, gateway: LiveGateway, task: dict, a: Attempt) -> None:
        run = self.attempt_function()

        async def in_its_thread():
            async with gateway.client(a.session) as client:
                return await run(dict(task), client)

        future, cancel = run_in_thread(in_its_thread)
        try:
            returned = await asyncio.wait_for(asyncio.wrap_future(future), self.attempt_timeout_s)
        except BaseException as err:  # noqa: BLE001 - sorted below: the agent's own failure, or not
            if future.done() and not future.cancelled() and future.exception() is err:
                # the agent raised (SystemExit included): that attempt fails, the step goes on
                a.error, a.error_kind = _one_line(err), type(err).__name__
                return
            if isinstance(err, TimeoutError) and (future.cancelled() or not future.done()):  # wait_for's own
                cancel()
                a.error, a.error_kind = f"no result within {self.attempt_timeout_s:g} s", "timeout"
                return
            cancel()
            raise  # Ctrl-C, or the rollout itself cancelled: not this attempt's doing
        try:
            a.outcome = outcome(returned)
        except ValueError as err:
            a.error, a.error_kind = str(err), "bad_return"

    def _settle(self, a: Attempt, task: dict) -> None:
        """Each trajectory's reward, finish reason and tool-call counts; a failed attempt's masks zeroed."""
        if a.failed:
            log.warning("agent attempt %s on task %s failed: %s", a.session, task.get("uid"), a.error)
        for t in a.trajectories:
            if self.tool_parser is not None:
                for start, end in t.turns:
                    text = self.tokenizer.decode(t.response_ids[start:end], skip_special_tokens=True)
                    parsed = self.tool_parser.parse(text)
                    if parsed.calls:
                        t.count("tool_calls", len(parsed.calls))
                    if parsed.errors:
                        t.count("tool_errors/parse", len(parsed.errors))
            if a.failed:
                t.rewards = [0.0]
                t.info["agent_error"] = a.error
                t.finish("error")
                t.loss_mask = [0] * len(t.loss_mask)
                continue
            if a.outcome.reward is not None:
                t.rewards = [a.outcome.reward]
            t.info.update(a.outcome.info)
            t.finish("done" if t.turn_stopped else "length")

    def _batch(self, attempts: list[Attempt], prompts: Batch, sampling: SamplingParams,
               every_trajectory: bool) -> tuple[Batch, list[int]]:
        """The rollout Batch (one row per trajectory, or per attempt) and each row's attempt index."""
        trajectories, rows, attempt_of = [], [], []
        for i, a in enumerate(attempts):
            kept = a.trajectories if every_trajectory else a.trajectories[-1:]
            if not kept:  # no completion: nothing to train, the reward still joins the group
                real = prompts["attention_mask"][a.row].bool()
                t = Trajectory(prompts["input_ids"][a.row][real].tolist(), [], self.max_response_tokens)
                if a.failed:
                    t.rewards, t.info["agent_error"] = [0.0], a.error
                elif a.outcome.reward is not None:
                    t.rewards = [a.outcome.reward]
                t.finish("error" if a.failed else "done")
                kept = [t]
            for t in kept:
                trajectories.append(t)
                rows.append(a.row)
                attempt_of.append(i)
        row_columns = Batch({}, dict(prompts.non_tensors), dict(prompts.meta)).index(rows)
        batch = trajectory_batch(trajectories, row_columns, self.tokenizer.pad_token_id, sampling.logit_temperature,
                                 self.max_response_tokens)
        return batch, attempt_of

    # ------------------------------------------------------------- metrics
    def _metrics(self, attempts: list[Attempt], attempt_of: list[int], gateway: LiveGateway) -> dict[str, float]:
        trajectories = [t for a in attempts for t in a.trajectories]
        metrics = {k: v for k, v in agent_metrics(trajectories).items() if k not in _ENVIRONMENT_ONLY}
        errors: dict[str, float] = defaultdict(float)
        for a in attempts:
            if a.failed and a.error_kind != "timeout":
                errors[f"agent/errors/{a.error_kind}"] += 1
        metrics.update({
            "agent/attempts": float(len(attempts)),
            "agent/errors/total": float(sum(errors.values())),
            **dict(sorted(errors.items())),
            "agent/timeouts": float(sum(a.error_kind == "timeout" for a in attempts)),
            "agent/no_completions": float(sum(not a.trajectories for a in attempts)),
            "agent/forked": float(sum(len(a.trajectories) > 1 for a in attempts)),
            "agent/trajectories": float(len(attempt_of)),
            "agent/generate_calls": float(gateway.engine.calls),
            "agent/rows_per_call/mean": gateway.engine.rows / gateway.engine.calls if gateway.engine.calls else 0.0,
        })
        rewards = [a.outcome.reward for a in attempts if a.outcome is not None and a.outcome.reward is not None]
        if rewards:
            metrics["agent/reward/mean"] = sum(rewards) / len(rewards)
        return metrics


def _tasks(prompts: Batch) -> list[dict]:
    """Each prompt row as the agent's `task`: prompt (its messages), ground_truth, extra_info, data_source, uid."""
    if not prompts.non_tensors or "uid" not in prompts.non_tensors:
        raise ValueError("AgentProgramRollout: the prompts carry no row columns for the agent's task (a PromptDataset "
                         "batch has uid, data_source, ground_truth, extra_info, and raw_prompt with raw_prompt=True)")
    if "raw_prompt" not in prompts.non_tensors:
        raise ValueError("AgentProgramRollout: the agent's task needs the row's chat messages (task['prompt']): build "
                         "the dataset with PromptDataset(raw_prompt=True)")
    names = {"raw_prompt": "prompt"}
    columns = prompts.non_tensors
    return [{names.get(k, k): columns[k][i] for k in columns} for i in range(len(prompts))]


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def _run(coroutine) -> Any:
    """Run the attempts' driver to the end in a fresh event loop (the trainer is synchronous)."""
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(coroutine)
    finally:
        loop.close()

