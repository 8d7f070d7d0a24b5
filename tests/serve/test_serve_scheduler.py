"""BatchScheduler: one generate per compatible batch, per-job cuts, bounded queue, timeouts, shutdown."""

import asyncio
import time

import pytest

from rlhf.serve.completion import finish, token_pieces
from rlhf.serve.completion import Generated
from rlhf.serve.scheduler import BatchScheduler, Job, Overloaded, QueueFull, ShuttingDown


class RecordingEngine:
    """The real engine, recording each generate call's (rows, sampling); optionally slow."""

    def __init__(self, engine, delay: float = 0.0):
        self.inner, self.delay, self.calls = engine, delay, []
        self.tokenizer, self.max_model_len = engine.tokenizer, engine.max_model_len
        self.pad_token_id, self.eos_token_ids = engine.pad_token_id, engine.eos_token_ids

    def generate(self, prompts, sampling, seed=None):
        self.calls.append((len(prompts), sampling))
        time.sleep(self.delay)
        return self.inner.generate(prompts, sampling, seed=seed)


def run(scheduler_kwargs, engine, body):
    """Run `body(scheduler)` on a fresh event loop with a started scheduler, then close it."""

    async def main():
        scheduler = BatchScheduler(engine, **scheduler_kwargs)
        scheduler.start()
        try:
            return await body(scheduler)
        finally:
            await scheduler.close()

    return asyncio.run(main())


def prompt(engine, text):
    return engine.tokenizer(text)["input_ids"]


def test_compatible_jobs_share_one_generate_and_keep_their_own_limits(engine):
    rec = RecordingEngine(engine)

    async def body(s):
        jobs = [Job([prompt(engine, "ab")], n=2, temperature=0, max_tokens=5),
                Job([prompt(engine, "c"), prompt(engine, "def")], temperature=0, max_tokens=8),
                Job([prompt(engine, "g")], temperature=0, max_tokens=7, top_p=0.5)]  # top_p is moot when greedy
        return await asyncio.gather(*[s.submit(j) for j in jobs])

    results = run({"batch_wait_s": 0.05}, rec, body)
    assert [(rows, s.max_new_tokens) for rows, s in rec.calls] == [(5, 8)]  # 2 + 2 + 1 rows, longest max_tokens
    assert [len(r) for r in results] == [2, 2, 1]
    assert all(len(c.token_ids) <= 5 for c in results[0]) and results[0][0].text == results[0][1].text


def test_different_sampling_settings_run_separately_in_arrival_order(engine):
    rec = RecordingEngine(engine)

    async def body(s):
        jobs = [Job([prompt(engine, "a")], temperature=0.5, max_tokens=3),
                Job([prompt(engine, "b")], temperature=0, max_tokens=3),
                Job([prompt(engine, "c")], temperature=0.5, max_tokens=3),
                Job([prompt(engine, "d")], temperature=0.5, max_tokens=40),  # another max_tokens bucket
                Job([prompt(engine, "e")], temperature=0.5, max_tokens=3, seed=1),  # seeded: alone
                Job([prompt(engine, "e")], temperature=0.5, max_tokens=3, seed=1)]
        return await asyncio.gather(*[s.submit(j) for j in jobs])

    results = run({"batch_wait_s": 0.05}, rec, body)
    assert [(rows, s.temperature, s.max_new_tokens) for rows, s in rec.calls] == [
        (2, 0.5, 3), (1, 0.0, 3), (1, 0.5, 40), (1, 0.5, 3), (1, 0.5, 3)
    ]
    assert results[4][0].token_ids == results[5][0].token_ids  # same seed, same prompt: same draw


def test_batches_are_capped_at_max_batch_size_rows(engine):
    rec = RecordingEngine(engine)

    async def body(s):
        return await asyncio.gather(*[s.submit(Job([prompt(engine, "x")], n=2, max_tokens=2)) for _ in range(5)])

    run({"max_batch_size": 4, "batch_wait_s": 0.05}, rec, body)
    assert [rows for rows, _ in rec.calls] == [4, 4, 2]


def test_queue_bound_timeout_and_shutdown(engine):
    rec = RecordingEngine(engine, delay=0.3)

    async def body(s):
        running = s.submit(Job([prompt(engine, "a")], max_tokens=2))
        await asyncio.sleep(0.05)  # the first job is now in the engine
        waiting = s.submit(Job([prompt(engine, "b")], max_tokens=2))
        with pytest.raises(QueueFull):
            s.submit(Job([prompt(engine, "c")], max_tokens=2))
        assert len(await running) == 1
        with pytest.raises(Overloaded):  # it waited 0.3 s > the 0.1 s queue timeout
            await waiting
        return "ok"

    assert run({"max_queue": 1, "queue_timeout_s": 0.1, "batch_wait_s": 0}, rec, body) == "ok"

    async def closing(s):
        queued = [s.submit(Job([prompt(engine, "a")], max_tokens=2)) for _ in range(2)]
        await asyncio.sleep(0.05)
        await s.close()
        with pytest.raises(ShuttingDown):
            s.submit(Job([prompt(engine, "z")], max_tokens=2))
        outcomes = await asyncio.gather(*queued, return_exceptions=True)
        assert isinstance(outcomes[0], list) and isinstance(outcomes[1], ShuttingDown)  # running one finished
        return "ok"

    assert run({"batch_wait_s": 0, "max_batch_size": 1}, RecordingEngine(engine, delay=0.2), closing) == "ok"


def test_an_engine_failure_fails_its_batch_only(engine):
    class Flaky(RecordingEngine):
        def generate(self, prompts, sampling, seed=None):
            if sampling.temperature == 0.3:
                raise RuntimeError("boom")
            return super().generate(prompts, sampling, seed)

    async def body(s):
        bad = s.submit(Job([prompt(engine, "a")], temperature=0.3, max_tokens=2))
        good = s.submit(Job([prompt(engine, "a")], temperature=0, max_tokens=2))
        with pytest.raises(RuntimeError, match="boom"):
            await bad
        return await good

    assert len(run({"batch_wait_s": 0.02}, Flaky(engine), body)) == 1


# ------------------------------------------------------------------------- completion cuts


def test_finish_reasons_and_stop_strings(engine):
    tok = engine.tokenizer
    eos = tok.eos_token_id
    hello = tok("hello world")["input_ids"]
    ended = Generated(hello + [eos], [-0.5] * (len(hello) + 1), hit_eos=True)
    done = finish(ended, tok, max_tokens=32)
    # EOS is a completion token but adds no text
    assert (done.text, done.finish_reason, len(done.token_ids)) == ("hello world", "stop", len(hello) + 1)
    cut = finish(ended, tok, max_tokens=5)  # cut before EOS: the length limit ended it
    assert (cut.text, cut.finish_reason, len(cut.token_ids)) == ("hello", "length", 5)
    stopped = finish(ended, tok, max_tokens=32, stop=("o w", "wor"))
    # "o w" starts at 4, "wor" at 6: the earliest wins; tokens up to the one completing "o w" ("h e l l o _ w")
    assert (stopped.text, stopped.finish_reason, len(stopped.token_ids)) == ("hell", "stop", 7)
    assert "".join(stopped.pieces) == stopped.text and len(stopped.pieces) == len(stopped.token_ids)
    assert len(stopped.log_probs) == 7


def test_token_pieces_hold_back_partial_characters(engine):
    tok = engine.tokenizer
    ids = tok("é!")["input_ids"]  # é is two bytes, two tokens in a byte-level vocabulary
    assert len(ids) == 3
    assert token_pieces(tok, ids) == ["", "é", "!"]
