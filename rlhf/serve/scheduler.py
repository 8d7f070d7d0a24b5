"""Batch concurrent requests into one `generate` call, in a worker thread, behind a bounded queue.

A request (a `Job`: one or more prompts, `n` samples each) waits in a FIFO queue. The
scheduler loop takes the oldest job, waits up to `batch_wait_s` after its arrival for
company, then takes every queued job that shares its `SamplingKey` (temperature, top-p,
top-k, max-tokens bucket; a seeded job shares with nobody), oldest first, up to
`max_batch_size` rows (prompts x n), and runs them as one `engine.generate` in a single
worker thread while the event loop keeps accepting requests. Jobs with other settings stay
queued, in order, for the next round. Within a batch each job is cut to its own `max_tokens`
and stop strings afterwards; `max_tokens` is bucketed by powers of two so a 16-token request
never waits behind a 1000-token one in the same `generate`.

`max_batch_size` may be changed while the scheduler runs (then call `wake()`): the agent-program loop
(rlhf.agent_programs) sets it to the number of attempts running, so a batch starts as soon as every
running attempt has sent its request, instead of waiting out `batch_wait_s` for attempts that are done.

The queue is bounded: `submit` raises `QueueFull` past `max_queue` waiting jobs (HTTP 429),
`ShuttingDown` once `close()` has begun (503), and a job that has waited longer than
`queue_timeout_s` fails with `Overloaded` (503) instead of hanging.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections import deque
from concurrent.futures import ThreadPoolExecutor

from rlhf.rollout import SamplingParams
from rlhf.rollout.engine import RolloutEngine
from rlhf.serve.completion import Completion, finish, generate_rows

log = logging.getLogger("rlhf.serve")


class QueueFull(Exception):
    """Too many requests are waiting (answer 429)."""


class ShuttingDown(Exception):
    """The server is stopping (answer 503)."""


class Overloaded(Exception):
    """A request waited longer than the queue timeout (answer 503)."""


@dataclasses.dataclass(frozen=True)
class SamplingKey:
    """Jobs with equal keys can share one `generate` call."""

    temperature: float
    top_p: float
    top_k: int
    max_tokens_bucket: int  # the next power of two >= max_tokens
    seeded: int | None  # the job's id() when it has a seed: it runs alone, so its RNG stream is its own


@dataclasses.dataclass(eq=False)
class Job:
    """One request: `n` samples of each prompt. Results come back prompt-major (prompt i, sample j)."""

    prompts: list[list[int]]
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 16
    stop: tuple[str, ...] = ()
    seed: int | None = None
    future: asyncio.Future | None = None  # set by `submit`
    arrival: float = 0.0  # the event loop's clock when submitted

    @property
    def rows(self) -> int:
        return len(self.prompts) * self.n

    @property
    def key(self) -> SamplingKey:
        greedy = self.temperature == 0
        return SamplingKey(
            temperature=self.temperature,
            top_p=1.0 if greedy else self.top_p,
            top_k=0 if greedy else self.top_k,
            max_tokens_bucket=1 << (self.max_tokens - 1).bit_length(),
            seeded=None if self.seed is None else id(self),
        )


class BatchScheduler:
    """Owns the request queue and the one thread that runs the engine."""

    def __init__(
        self,
        engine: RolloutEngine,
        max_batch_size: int = 32,
        batch_wait_s: float = 0.01,
        max_queue: int = 512,
        queue_timeout_s: float = 600.0,
    ):
        self.engine = engine
        self.max_batch_size = max_batch_size
        self.batch_wait_s = batch_wait_s
        self.max_queue = max_queue
        self.queue_timeout_s = queue_timeout_s
        self._queue: deque[tuple[Job, SamplingKey]] = deque()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rlhf-serve-generate")
        self._arrived: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None
        self._closing = False
        self.batches_run = 0  # counters for /health and tests
        self.rows_run = 0

    @property
    def queued(self) -> int:
        return len(self._queue)

    def start(self) -> None:
        """Start the scheduling loop on the running event loop."""
        self._arrived = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self._task = self._loop.create_task(self._run_loop(), name="rlhf-serve-scheduler")

    def wake(self) -> None:
        """From any thread: look at the queue again (after `max_batch_size` changed)."""
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._arrived.set)

    def submit(self, job: Job) -> asyncio.Future:
        """Queue a job; its future resolves to one `Completion` per row."""
        if self._closing or self._task is None:
            raise ShuttingDown("the server is shutting down")
        if len(self._queue) >= self.max_queue:
            raise QueueFull(f"{len(self._queue)} requests are already queued (limit {self.max_queue})")
        loop = asyncio.get_running_loop()
        job.future, job.arrival = loop.create_future(), loop.time()
        self._queue.append((job, job.key))
        self._arrived.set()
        return job.future

    async def close(self, grace_s: float = 30.0) -> None:
        """Refuse new jobs, fail queued ones with `ShuttingDown`, let the running batch finish.

        A batch still running after `grace_s` is abandoned: its requests fail with `ShuttingDown`.
        """
        self._closing = True
        while self._queue:
            job, _ = self._queue.popleft()
            _fail(job, ShuttingDown("the server is shutting down"))
        if self._task is not None and not self._task.done():
            self._arrived.set()
            try:
                await asyncio.wait_for(asyncio.shield(self._task), grace_s)
            except TimeoutError:
                self._task.cancel()
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def _run_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._closing:
            await self._arrived.wait()
            self._arrived.clear()
            while self._queue and not self._closing:
                await self._wait_for_company(loop)
                jobs = self._take_batch(loop.time())
                if jobs:
                    await self._run(loop, jobs)

    async def _wait_for_company(self, loop: asyncio.AbstractEventLoop) -> None:
        """Up to `batch_wait_s` after the oldest job arrived, or until a batch is full."""
        oldest, key = self._queue[0]
        deadline = oldest.arrival + self.batch_wait_s
        while loop.time() < deadline and sum(j.rows for j, k in self._queue if k == key) < self.max_batch_size:
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), deadline - loop.time())
            except TimeoutError:
                break

    def _take_batch(self, now: float) -> list[Job]:
        """The oldest live job and every queued job sharing its key, up to `max_batch_size` rows."""
        while self._queue:  # drop jobs whose client went away; fail those that waited too long
            job, _ = self._queue[0]
            if job.future.done():
                self._queue.popleft()
            elif now - job.arrival > self.queue_timeout_s:
                self._queue.popleft()
                _fail(job, Overloaded(f"the request waited more than {self.queue_timeout_s:g} s in the queue"))
            else:
                break
        if not self._queue:
            return []
        key = self._queue[0][1]
        taken, rows, rest = [], 0, deque()
        for job, job_key in self._queue:
            fits = not taken or rows + job.rows <= self.max_batch_size
            if job_key == key and fits and not job.future.done():
                taken.append(job)
                rows += job.rows
            elif not job.future.done():
                rest.append((job, job_key))
        self._queue = rest
        return taken

    async def _run(self, loop: asyncio.AbstractEventLoop, jobs: list[Job]) -> None:
        try:
            results = await loop.run_in_executor(self._executor, self._generate, jobs)
        except asyncio.CancelledError:
            for job in jobs:
                _fail(job, ShuttingDown("the server shut down during generation"))
            raise
        except Exception as err:  # the engine failed: these requests fail, the server stays up
            log.exception("generation failed for a batch of %d requests", len(jobs))
            for job in jobs:
                _fail(job, err)
            return
        for job, completions in zip(jobs, results):
            if not job.future.done():
                job.future.set_result(completions)

    def _generate(self, jobs: list[Job]) -> list[list[Completion]]:
        """Runs in the worker thread: one `generate` for all rows, then each job's own cuts."""
        first = jobs[0]
        sampling = SamplingParams(
            n=1,
            temperature=first.temperature,
            top_p=first.top_p,
            top_k=first.top_k,
            max_new_tokens=max(job.max_tokens for job in jobs),
        )
        rows = [prompt for job in jobs for prompt in job.prompts for _ in range(job.n)]
        generated = generate_rows(self.engine, rows, sampling, seed=first.seed)
        self.batches_run += 1
        self.rows_run += len(rows)
        tokenizer, results, start = self.engine.tokenizer, [], 0
        for job in jobs:
            mine = generated[start : start + job.rows]
            results.append([finish(g, tokenizer, job.max_tokens, job.stop) for g in mine])
            start += job.rows
        return results


def _fail(job: Job, err: BaseException) -> None:
    if job.future is not None and not job.future.done():
        job.future.set_exception(err)
