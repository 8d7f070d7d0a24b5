"""`WorkerPool`: persistent scoring processes with a per-row timeout that kills a stuck row.

`concurrent.futures.ProcessPoolExecutor` cannot stop a running task, so a scorer caught
in an infinite loop (or in a regex backtracking inside C, where no signal reaches it)
would hold a training step forever. Here each worker is a spawned process with its own
pipe. Rows travel in chunks (one message each way per chunk, not per row), and while
scoring, a worker writes which row of its chunk it is on and since when into a small
shared array; the parent reads it, and when a row runs past `timeout_s` it kills that
worker, records the row as timed out, starts a replacement and sends the chunk's other
rows again. The same happens when a worker dies (a segfault, `os._exit` in a scorer).

Workers are spawned (never forked: the parent may hold threads and CUDA), started once
and reused; `close()` stops them, and so does interpreter exit or garbage collection.
"""

from __future__ import annotations

import math
import multiprocessing
import multiprocessing.connection
import pickle
import signal
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

Outcome = tuple[str, Any]
"""("ok", value), or ("error" | "timeout" | "died", message) for a row that failed."""

_SEQ, _ROW, _SINCE = 0, 1, 2  # progress slots: seqlock counter, row in chunk, start time (0: idle)
MAX_IDLE_DEATHS = 3
"""Workers that may die outside any row in one `map` call before it gives up."""


class WorkerPoolError(RuntimeError):
    """The pool cannot work at all (e.g. workers cannot load the function or its context)."""


def _worker_main(conn: multiprocessing.connection.Connection, payload: bytes, progress: Any) -> None:
    """Loop: receive (chunk id, rows), apply fn(context, *row) to each, send the outcomes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    try:
        fn, context = pickle.loads(payload)
    except BaseException as err:  # noqa: BLE001 - reported to the parent, which raises
        conn.send_bytes(pickle.dumps(("init_error", f"{type(err).__name__}: {err}")))
        return
    conn.send_bytes(pickle.dumps(("ready", None)))
    while True:
        try:
            message = conn.recv_bytes()
        except EOFError:
            return
        if not message:
            return
        chunk_id, rows = pickle.loads(message)
        outcomes: list[Outcome] = []
        for j, row in enumerate(rows):
            progress[_SEQ] += 1
            progress[_ROW], progress[_SINCE] = j, time.monotonic()
            progress[_SEQ] += 1
            try:
                outcomes.append(("ok", fn(context, *row)))
            except BaseException as err:  # noqa: BLE001 - SystemExit in a scorer is a failure too
                outcomes.append(("error", f"{type(err).__name__}: {err}"))
        progress[_SEQ] += 1
        progress[_SINCE] = 0.0
        progress[_SEQ] += 1
        conn.send_bytes(_dumps_outcomes(chunk_id, outcomes))


def _dumps_outcomes(chunk_id: int, outcomes: list[Outcome]) -> bytes:
    try:
        return pickle.dumps((chunk_id, outcomes))
    except Exception:  # noqa: BLE001 - find the rows whose results cannot travel
        fixed = []
        for outcome in outcomes:
            try:
                pickle.dumps(outcome)
                fixed.append(outcome)
            except Exception as err:  # noqa: BLE001
                fixed.append(("error", f"returned a value that cannot be sent between processes: {err}"))
        return pickle.dumps((chunk_id, fixed))


def _dumps_rows(chunk_id: int, rows: list[tuple]) -> bytes:
    try:
        return pickle.dumps((chunk_id, rows))
    except (pickle.PicklingError, TypeError, AttributeError) as err:
        raise WorkerPoolError(
            f"rows cannot be sent to worker processes: {err}. Fix: keep ground truths and extra_info "
            "to plain data (str, numbers, lists, dicts), or score in-process with num_workers=0."
        ) from err


class _Worker:
    def __init__(self, ctx: Any, payload: bytes, name: str) -> None:
        self.conn, child_conn = ctx.Pipe(duplex=True)
        self.progress = ctx.RawArray("d", 3)
        self.process = ctx.Process(
            target=_worker_main, args=(child_conn, payload, self.progress), name=name, daemon=True
        )
        self.process.start()
        child_conn.close()
        self.ready = False  # it has loaded fn and context and waits for rows
        self.chunk: tuple[int, list] | None = None  # (chunk id, [(row index, row), ...]) in flight

    def row_started(self) -> tuple[int, float] | None:
        """(row in chunk, start time) of the row being scored now, or None when idle."""
        for _ in range(1000):  # a seqlock read: retry while the worker is mid-update
            seq = self.progress[_SEQ]
            row, since = self.progress[_ROW], self.progress[_SINCE]
            if seq % 2 == 0 and self.progress[_SEQ] == seq:
                return (int(row), since) if since > 0 else None
        return None  # still mid-update (descheduled there, or died there): look again later

    def stop(self, grace_s: float) -> None:
        try:
            self.conn.send_bytes(b"")
        except (OSError, ValueError):
            pass
        self.process.join(grace_s)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.conn.close()


class WorkerPool:
    """Apply `fn(context, *row)` to rows in `num_workers` persistent processes.

    fn, context: picklable (fn a module-level function); sent to each worker once.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        context: Any,
        *,
        num_workers: int,
        timeout_s: float | None,
        chunk_size: int | None,
    ) -> None:
        """
        num_workers: processes started (lazily, on the first `map`).
        timeout_s: the longest one row may run before its worker is killed; None waits forever.
        chunk_size: rows per message; None splits each call into about 4 chunks per worker.
        """
        if num_workers < 1:
            raise ValueError(f"WorkerPool: num_workers must be >= 1, got {num_workers}")
        self.num_workers = num_workers
        self.timeout_s = timeout_s
        self.chunk_size = chunk_size
        self._payload = pickle.dumps((fn, context))
        self._ctx = multiprocessing.get_context("spawn")
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()
        self._started = 0
        self._finalizer = weakref.finalize(self, _stop_all, self._workers)

    @property
    def processes_started(self) -> int:
        """Worker processes started so far (num_workers at first, plus one per kill or death)."""
        return self._started

    def _spawn(self) -> _Worker:
        self._started += 1
        return _Worker(self._ctx, self._payload, f"rlhf-reward-worker-{self._started}")

    def map(self, rows: Sequence[tuple]) -> list[Outcome]:
        """One outcome per row, in order. Raises `WorkerPoolError` if workers cannot start."""
        with self._lock:
            if not self._finalizer.alive:
                raise WorkerPoolError("WorkerPool.map after close(). Fix: make a new pool.")
            try:
                return self._map(rows)
            except BaseException:
                _stop_all(self._workers)  # workers may hold half-done chunks: start afresh next time
                raise

    def _map(self, rows: Sequence[tuple]) -> list[Outcome]:
        if not rows:
            return []
        while len(self._workers) < self.num_workers:
            self._workers.append(self._spawn())
        size = self.chunk_size or max(1, math.ceil(len(rows) / (4 * self.num_workers)))
        indexed = list(enumerate(rows))
        pending = deque(indexed[i : i + size] for i in range(0, len(indexed), size))
        outcomes: list[Outcome | None] = [None] * len(rows)
        self._next_id, self._idle_deaths = 0, 0
        while pending or any(w.chunk for w in self._workers):
            self._dispatch(pending)
            busy = [w for w in self._workers if w.chunk]
            waiting = [w for w in self._workers if w.chunk or not w.ready]
            ready = multiprocessing.connection.wait(
                [w.conn for w in waiting] + [w.process.sentinel for w in busy], self._wait_s(busy)
            )
            self._collect([w for w in waiting if w.conn in ready], outcomes)
            self._recover(pending, outcomes)
        return outcomes  # type: ignore[return-value]

    def _dispatch(self, pending: deque) -> None:
        """Replace workers that died idle; send the next chunk to each ready idle worker."""
        for slot, worker in enumerate(self._workers):
            if not worker.process.is_alive() and worker.chunk is None:  # died while idle or starting
                self._idle_deaths += 1
                self._check_idle_deaths(self._idle_deaths, worker)
                worker.stop(grace_s=0.0)
                self._workers[slot] = self._spawn()
            elif worker.ready and worker.chunk is None and pending:  # a starting worker waits
                chunk = pending.popleft()
                message = _dumps_rows(self._next_id, [row for _, row in chunk])
                worker.chunk = (self._next_id, chunk)
                self._next_id += 1
                try:
                    worker.conn.send_bytes(message)
                except OSError:
                    pass  # it just died: its sentinel is ready, and the chunk is sent again by _recover

    @staticmethod
    def _collect(answered: list[_Worker], outcomes: list) -> None:
        """Read each answering worker's reply: its start-up state, or its chunk's outcomes."""
        for worker in answered:
            try:
                reply = pickle.loads(worker.conn.recv_bytes())
            except (EOFError, OSError):  # it died; handled by _recover (busy) or _dispatch (idle)
                worker.process.join(0.1)  # reap it, so is_alive() says so
                continue
            if reply[0] == "init_error":
                raise WorkerPoolError(
                    f"a reward worker process could not load the scorers: {reply[1]}. Fix: define "
                    "scorers at module level in an importable module (functools.partial of them is "
                    "fine), or score in-process with num_workers=0."
                )
            if reply[0] == "ready":
                worker.ready = True
                continue
            _, results = reply
            for (index, _), outcome in zip(worker.chunk[1], results):
                outcomes[index] = outcome
            worker.chunk = None

    def _recover(self, pending: deque, outcomes: list) -> None:
        """A busy worker that died or overran `timeout_s`: blame the row it was on, send the rest again."""
        for slot, worker in enumerate(self._workers):
            if worker.chunk is None:
                continue
            dead = not worker.process.is_alive()
            started = worker.row_started()
            overdue = self.timeout_s is not None and started is not None and time.monotonic() - started[1] > self.timeout_s
            if not (dead or overdue):
                continue
            if dead:
                worker.process.join()
                reason = ("died", f"the reward worker process exited with code {worker.process.exitcode} "
                                  "while scoring this row")
            else:
                reason = ("timeout", f"did not finish within timeout_s={self.timeout_s} s "
                                     "(its worker process was killed)")
            chunk = worker.chunk[1]
            if started is None:  # died between rows: nothing to blame, send the chunk again
                self._idle_deaths += 1
                self._check_idle_deaths(self._idle_deaths, worker)
                retry = chunk
            else:
                outcomes[chunk[started[0]][0]] = reason
                retry = chunk[: started[0]] + chunk[started[0] + 1 :]
            if retry:
                pending.appendleft(retry)
            worker.chunk = None
            worker.stop(grace_s=0.0)
            self._workers[slot] = self._spawn()

    @staticmethod
    def _check_idle_deaths(count: int, worker: _Worker) -> None:
        if count > MAX_IDLE_DEATHS:
            raise WorkerPoolError(
                f"reward worker processes died {count} times outside any scorer (last exit code "
                f"{worker.process.exitcode}). Fix: see the worker's traceback on stderr; the usual causes "
                "are a scorer module that fails to import, a memory limit, or a script that creates the "
                "pool without an `if __name__ == \"__main__\":` guard (workers are spawned and re-import it)."
            )

    def _wait_s(self, busy: list[_Worker]) -> float | None:
        """How long the parent may sleep before some row could run past its timeout."""
        if self.timeout_s is None:
            return None
        now = time.monotonic()
        deadline = now + self.timeout_s  # a row that starts later has a later deadline
        for worker in busy:
            started = worker.row_started()
            if started is not None:
                deadline = min(deadline, started[1] + self.timeout_s)
        return max(0.0, deadline - now) + 0.001

    def close(self) -> None:
        """Stop the workers (idempotent); the pool cannot be used afterwards."""
        self._finalizer()

    def __repr__(self) -> str:
        return f"WorkerPool(num_workers={self.num_workers}, timeout_s={self.timeout_s}, chunk_size={self.chunk_size})"


def _stop_all(workers: list[_Worker]) -> None:
    """Ask idle workers to exit, kill busy ones; empties the list (the pool restarts them lazily)."""
    for worker in workers:
        worker.stop(grace_s=0.0 if worker.chunk else 1.0)
    workers.clear()
