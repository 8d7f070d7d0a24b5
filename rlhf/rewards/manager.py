"""`RewardManager`: score a batch of responses, each with the scorer of its data source.

The scorers are a plain dict from data_source to function, chosen by whoever builds
the manager (in Python or in the experiment graph); a key ending in "*" covers every data_source
it prefixes ("reasoning_gym/*"; `rlhf.rewards.registry.rule_key`), e.g.::

    RewardManager({"openai/gsm8k": gsm8k_score,
                   "countdown": functools.partial(countdown_score, format_score=0.0)})

A scorer is called as `scorer(response, ground_truth, extra_info)` and returns a float,
or a dict with a "score" and any other values to report per row (they become `extras`).
`default` scores the data sources the dict does not name (`RewardManager({}, default=my_score)`
scores every row with `my_score`, which is what `rlhf eval --scorer module:function` builds).

A **batched** scorer (any callable with a true `batched` attribute, e.g. `Batched(fn)` or a
model-reward class that sets `batched = True`) is called once per manager call with the
lists of all rows of its data_source, `scorer(responses, ground_truths, extra_infos)`, and
returns one float or dict per row. It always runs in the calling process (it may hold a
model), so `timeout_s` does not apply to it.

**Parallel scoring**: with `num_workers > 0` the other rows are scored in a persistent pool
of spawned processes (`rlhf.rewards.pool.WorkerPool`), started on the first call and
reused, in chunks; a row running past `timeout_s` has its worker killed and gets
`fallback_score`. Scores, extras and metrics are the same as in-process scoring. Scorers
must then be picklable: module-level functions or `functools.partial` of them. It pays
for scorers that cost ~1 ms or more a row (or may hang); for a ~10 us rule such as
`gsm8k_score`, sending the rows costs more than scoring them in-process.

Failures: "reward/errors" counts every row given `fallback_score` (exceptions, timeouts,
dead workers), "reward/errors/<data_source>" per source, and "reward/timeouts" (reported
when `timeout_s` is set) the rows that ran out of time. A non-finite number (NaN, inf) among a
dict scorer's extra values is kept as it is and counted in "reward/extra_nonfinite" and
"reward/extra_nonfinite/<name>"; both kinds are also logged as warnings.

**Extra values as metrics**: every numeric extra value (bools as 0/1) is averaged per data source over
the rows that reported it, as "reward/extra/<data_source>/<name>/mean". The convention for partial
credit: a scorer that gives credit for less than a right answer reports `partial` = 1 on a row whose
score is > 0 but came only from partial credit (0 otherwise), so "reward/extra/<source>/partial/mean"
is the share of samples rewarded without being right (docs/rewards.md).

**Overlong shaping** (DAPO, Yu et al. 2025, "soft overlong punishment"): with
`overlong_buffer_len` set, a response of L tokens gets, on top of its score, the penalty

    0                                      if L <= Lmax - Lbuf
    -factor * (L - (Lmax - Lbuf)) / Lbuf   if Lmax - Lbuf < L <= Lmax
    -factor                                if L > Lmax

with Lmax = `max_new_tokens`, Lbuf = `overlong_buffer_len`, factor =
`overlong_penalty_factor` (verl's `reward_model.overlong_buffer`; verl does not clip
above Lmax, which generation never exceeds). Lengths come from `response_lengths`; Lmax is
the generation limit of the responses being scored, given with them (`max_new_tokens`, which
the trainers read from the rollout batch: it is set once, in `SamplingParams.max_new_tokens`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import pickle
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

from rlhf.rewards.pool import Outcome, WorkerPool
from rlhf.ranges import NonNegativeInt, PositiveFloat, PositiveInt
from rlhf.rewards.registry import rule_key
from rlhf.typefit import check_arguments

logger = logging.getLogger(__name__)

Scorer = Callable[..., "float | dict"]


class UnknownDataSourceError(ValueError):
    """Some rows have a data_source that no scorer is registered for in this manager."""


class ScorerError(RuntimeError):
    """A scorer raised, timed out or returned something that is not a score (strict mode)."""


@dataclasses.dataclass
class RewardOutput:
    """One score per response, extra per-row columns from dict-returning scorers, metrics.

    scores: (B,) one float per response.
    extras: column name -> (B,) values; None in rows whose scorer did not report it.
    metrics: verl-style names, e.g. "reward/errors" (scorer failures replaced by the fallback).
    """

    scores: list[float]
    extras: dict[str, list] = dataclasses.field(default_factory=dict)
    metrics: dict[str, float] = dataclasses.field(default_factory=dict)


class Reward(Protocol):
    """What trainers need from a reward: `RewardManager`, `CombinedReward`, or your own."""

    def check_sources(self, data_sources: Iterable[str]) -> None: ...

    def check_generation_limit(self, max_new_tokens: int) -> None: ...

    def __call__(
        self,
        responses: Sequence[str],
        data_sources: Sequence[str],
        ground_truths: Sequence[str],
        extra_infos: Sequence[dict | None],
        *,
        response_lengths: Sequence[int] | None = None,
        max_new_tokens: int | None = None,
    ) -> RewardOutput: ...


class Batched:
    """Mark `fn(responses, ground_truths, extra_infos) -> list[float | dict]` as a batched scorer."""

    batched = True

    def __init__(self, fn: Callable[[list[str], list, list], Sequence[float | dict]]) -> None:
        if not callable(fn):
            raise TypeError(f"Batched: {fn!r} is not callable")
        self.fn = fn

    def __call__(self, responses: list[str], ground_truths: list, extra_infos: list) -> Sequence[float | dict]:
        return self.fn(responses, ground_truths, extra_infos)

    def __repr__(self) -> str:
        return f"Batched({getattr(self.fn, '__name__', self.fn)!r})"


def is_batched(scorer: Scorer) -> bool:
    """Whether the manager calls `scorer` with lists (it has `batched = True`)."""
    return getattr(scorer, "batched", False) is True


def _as_score(result: Any) -> tuple[float, dict[str, Any]]:
    """Split a scorer's result into (score, extras); TypeError/ValueError if it is not one."""
    extras: dict[str, Any] = {}
    if isinstance(result, Mapping):
        if "score" not in result:
            raise ValueError(f"returned a dict without a 'score' key (keys: {sorted(result)})")
        extras = {k: v for k, v in result.items() if k != "score"}
        result = result["score"]
    if isinstance(result, (str, bytes)) or not hasattr(result, "__float__"):
        raise TypeError(f"returned {type(result).__name__} {result!r}, not a number")
    value = float(result)
    if not math.isfinite(value):
        raise ValueError(f"returned a non-finite score {value}")
    return value, extras


def _score_with(scorers: Mapping[str, Scorer], source: str, response: str, truth: Any, extra: Any) -> tuple:
    """Score one row: what a worker process runs, and what in-process scoring runs."""
    return _as_score(scorers[source](response, truth, extra))


class RewardManager:
    """Dispatch each response to the scorer of its data_source and collect the rewards."""

    def __init__(
        self,
        scorers: Mapping[str, Scorer],
        *,
        strict: bool = True,
        fallback_score: float = 0.0,
        num_workers: NonNegativeInt = 0,
        timeout_s: PositiveFloat | None = None,
        chunk_size: PositiveInt | None = None,
        overlong_buffer_len: PositiveInt | None = None,
        overlong_penalty_factor: float = 1.0,
        default: Scorer | None = None,
    ) -> None:
        """
        scorers: data_source -> scorer function (see `rlhf.rewards.default_scorers()`).
        default: the scorer of every data_source not in `scorers`; None: such a row is an error.
        strict: re-raise a scorer failure (with row and data_source); when False, the row
          gets `fallback_score` and the failure is counted in metrics "reward/errors".
        fallback_score: the score of a row whose scorer failed or timed out (strict=False only).
        num_workers: 0 scores in this process, one row after another; N > 0 in N worker processes.
        timeout_s: the longest one row may take (needs num_workers > 0); None waits forever.
        chunk_size: rows per message to a worker; None splits each call into ~4 chunks per worker.
        overlong_buffer_len: DAPO's Lbuf in tokens; None disables overlong shaping. Lmax, the
          generation limit, comes with each call (`max_new_tokens`), never from here.
        overlong_penalty_factor: the penalty at the generation limit (DAPO and verl use 1.0).
        """
        for name, scorer in scorers.items():
            if not callable(scorer):
                raise TypeError(f"RewardManager: the scorer for data_source {name!r} is not callable: {scorer!r}")
        if default is not None and not callable(default):
            raise TypeError(f"RewardManager: the default scorer is not callable: {default!r}")
        check_arguments(RewardManager, dict(num_workers=num_workers, timeout_s=timeout_s, chunk_size=chunk_size,
                                             overlong_buffer_len=overlong_buffer_len))
        if timeout_s is not None and num_workers == 0:
            raise ValueError(
                "RewardManager: timeout_s needs num_workers >= 1, because a scorer running in this "
                "process cannot be stopped safely. Fix: pass num_workers=1 (or more), or timeout_s=None."
            )
        self.scorers = dict(scorers)
        self.strict = strict
        self.fallback_score = float(fallback_score)
        self.num_workers = num_workers
        self.timeout_s = timeout_s
        self.chunk_size = chunk_size
        self.overlong_buffer_len = overlong_buffer_len
        self.overlong_penalty_factor = float(overlong_penalty_factor)
        self.default = default
        # "" is no data_source (rows need a non-empty one): the default scorer's key
        table = {**self.scorers, **({"": default} if default is not None else {})}
        self._table = table
        self._pooled = {name: s for name, s in table.items() if not is_batched(s)}
        if num_workers:
            _check_picklable(self._pooled)
        self._pool: WorkerPool | None = None
        self._lock = threading.Lock()

    def check_sources(self, data_sources: Iterable[str]) -> None:
        """Raise `UnknownDataSourceError` if any data_source has no scorer (call before training)."""
        sources = {str(s) for s in data_sources} if self.default is None else set()
        unknown = sorted(s for s in sources if rule_key(self.scorers, s) is None)
        if unknown:
            raise UnknownDataSourceError(
                f"no reward scorer for data_source {', '.join(map(repr, unknown))}; scorers are known "
                f"for {', '.join(map(repr, sorted(self.scorers))) or 'nothing'}. Fix: add the missing "
                "source to the scorers dict given to RewardManager (e.g. {**default_scorers(), "
                f"{unknown[0]!r}: my_score}}), give it a default scorer for every other source, or correct the "
                "rows' data_source."
            )

    def check_generation_limit(self, max_new_tokens: int) -> None:
        """Raise ValueError if overlong shaping cannot work with responses cut at `max_new_tokens`
        (trainers call it at construction with their `SamplingParams.max_new_tokens`)."""
        if self.overlong_buffer_len is not None and self.overlong_buffer_len > max_new_tokens:
            raise ValueError(
                f"RewardManager: overlong_buffer_len={self.overlong_buffer_len} is longer than the generation "
                f"limit SamplingParams.max_new_tokens={max_new_tokens}; the buffer must fit in 1..max_new_tokens. "
                "Fix: lower overlong_buffer_len or raise max_new_tokens."
            )

    def __call__(
        self,
        responses: Sequence[str],
        data_sources: Sequence[str],
        ground_truths: Sequence[str],
        extra_infos: Sequence[dict | None],
        *,
        response_lengths: Sequence[int] | None = None,
        max_new_tokens: int | None = None,
    ) -> RewardOutput:
        """Score every response; all sequences are per row and of equal length.

        response_lengths: (B,) response lengths in tokens; needed by overlong shaping only.
        max_new_tokens: the generation limit the responses were cut at (`SamplingParams.max_new_tokens`,
          in a rollout batch's meta); needed by overlong shaping only.
        """
        self._check_inputs(responses, data_sources, ground_truths, extra_infos, response_lengths, max_new_tokens)
        outcomes, causes = self._outcomes(responses, data_sources, ground_truths, extra_infos)
        scores: list[float] = []
        row_extras: list[dict[str, Any]] = []
        errors: dict[str, int] = {}
        timeouts = 0
        first_error: str | None = None
        for i, ((kind, value), source) in enumerate(zip(outcomes, data_sources)):
            if kind == "ok":
                scores.append(value[0])
                row_extras.append(value[1])
                continue
            message = f"scorer for data_source {source!r} failed on row {i}: {value}"
            if self.strict:
                where = "" if i in causes else " (in a reward worker process)"
                hint = " (RewardManager(strict=False) gives such rows fallback_score instead)"
                raise ScorerError(message + where + hint) from causes.get(i)
            errors[source] = errors.get(source, 0) + 1
            timeouts += kind == "timeout"
            first_error = first_error or message
            scores.append(self.fallback_score)
            row_extras.append({})

        metrics = {"reward/errors": float(sum(errors.values()))}
        metrics.update({f"reward/errors/{source}": float(n) for source, n in errors.items()})
        metrics.update(_nonfinite_extras(row_extras))
        metrics.update(extra_means(row_extras, data_sources))
        if self.timeout_s is not None:
            metrics["reward/timeouts"] = float(timeouts)
        if errors:
            logger.warning("%d reward scorer failure(s) given fallback_score=%s; first: %s",
                           sum(errors.values()), self.fallback_score, first_error)
        if self.overlong_buffer_len is not None:
            # imported here: reward worker processes import this module, and must not pay for torch
            import torch

            from rlhf.algos.dapo import overlong_penalty

            penalties = overlong_penalty(  # the one implementation, rlhf.algos.dapo
                torch.tensor([int(n) for n in response_lengths]),  # type: ignore[union-attr]
                max_new_tokens=max_new_tokens,  # type: ignore[arg-type]
                overlong_buffer_len=self.overlong_buffer_len,
                penalty_factor=self.overlong_penalty_factor,
            ).tolist()
            scores = [s + p for s, p in zip(scores, penalties)]
            for extras, penalty in zip(row_extras, penalties):
                extras["overlong_penalty"] = penalty
            metrics["reward/overlong_penalty/mean"] = sum(penalties) / len(penalties) if penalties else 0.0
        columns = list(dict.fromkeys(k for extras in row_extras for k in extras))
        return RewardOutput(
            scores=scores,
            extras={k: [extras.get(k) for extras in row_extras] for k in columns},
            metrics=metrics,
        )

    def _check_inputs(self, responses: Sequence[str], data_sources: Sequence[str], ground_truths: Sequence[str],
                      extra_infos: Sequence[dict | None], response_lengths: Sequence[int] | None,
                      max_new_tokens: int | None) -> None:
        """Raise ValueError unless the per-row inputs agree in length and overlong shaping has what it needs;
        UnknownDataSourceError for a data_source without a scorer."""
        lengths = {
            "responses": len(responses),
            "data_sources": len(data_sources),
            "ground_truths": len(ground_truths),
            "extra_infos": len(extra_infos),
        }
        if response_lengths is not None:
            lengths["response_lengths"] = len(response_lengths)
        if len(set(lengths.values())) > 1:
            raise ValueError(f"RewardManager: inputs disagree on the number of rows: {lengths}")
        if self.overlong_buffer_len is not None and response_lengths is None:
            raise ValueError(
                "RewardManager: overlong shaping (overlong_buffer_len) needs response_lengths, the "
                "number of tokens of each response. Fix: pass response_lengths=response_mask.sum(-1).tolist()."
            )
        if self.overlong_buffer_len is not None:
            if max_new_tokens is None:
                raise ValueError(
                    "RewardManager: overlong shaping (overlong_buffer_len) needs max_new_tokens, the generation "
                    "limit the responses were cut at. Fix: pass max_new_tokens=batch.meta['max_new_tokens'] (every "
                    "rollout batch records its SamplingParams.max_new_tokens there)."
                )
            self.check_generation_limit(max_new_tokens)
        self.check_sources(data_sources)

    def _outcomes(
        self,
        responses: Sequence[str],
        data_sources: Sequence[str],
        ground_truths: Sequence[str],
        extra_infos: Sequence[dict | None],
    ) -> tuple[list[Outcome], dict[int, BaseException]]:
        """Each row's outcome, and the exception of each row that failed in this process."""
        outcomes: list[Outcome | None] = [None] * len(responses)
        causes: dict[int, BaseException] = {}
        batched: dict[str, list[int]] = {}
        pooled: list[int] = []
        keys = [rule_key(self.scorers, source) or "" for source in data_sources]  # "": the default scorer
        for i, key in enumerate(keys):
            (pooled if key in self._pooled else batched.setdefault(key, [])).append(i)
        for source, rows in batched.items():
            self._score_batched(source, rows, responses, ground_truths, extra_infos, outcomes, causes)
        if self.num_workers and pooled:
            rows = [(keys[i], responses[i], ground_truths[i], extra_infos[i]) for i in pooled]
            for i, outcome in zip(pooled, self._map(rows)):
                outcomes[i] = outcome
        else:
            for i in pooled:
                try:
                    value = _score_with(self._pooled, keys[i], responses[i], ground_truths[i], extra_infos[i])
                    outcomes[i] = ("ok", value)
                except (Exception, SystemExit) as err:  # sys.exit() in a scorer must not end training
                    outcomes[i] = ("error", f"{type(err).__name__}: {err}")
                    causes[i] = err
        return outcomes, causes  # type: ignore[return-value]

    def _score_batched(self, source, rows, responses, ground_truths, extra_infos, outcomes, causes) -> None:
        """One call of the batched scorer of `source` with all its rows; failures mark every row."""
        try:
            results = list(self._table[source](
                [responses[i] for i in rows], [ground_truths[i] for i in rows], [extra_infos[i] for i in rows]
            ))
            if len(results) != len(rows):
                raise ValueError(f"batched scorer returned {len(results)} results for {len(rows)} rows")
        except (Exception, SystemExit) as err:
            for i in rows:
                outcomes[i] = ("error", f"{type(err).__name__}: {err}")
                causes[i] = err
            return
        for i, result in zip(rows, results):
            try:
                outcomes[i] = ("ok", _as_score(result))
            except (TypeError, ValueError) as err:
                outcomes[i] = ("error", f"{type(err).__name__}: {err}")
                causes[i] = err

    def _map(self, rows: list[tuple]) -> list[Outcome]:
        with self._lock:
            if self._pool is None:
                self._pool = WorkerPool(
                    _score_with, self._pooled, num_workers=self.num_workers, timeout_s=self.timeout_s,
                    chunk_size=self.chunk_size,
                )
            return self._pool.map(rows)

    def close(self) -> None:
        """Stop the worker processes, if any (a later call starts new ones)."""
        with self._lock:
            if self._pool is not None:
                self._pool.close()
                self._pool = None

    def __enter__(self) -> RewardManager:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __getstate__(self) -> dict:
        # A manager sent to another process (e.g. a Ray worker) starts its own pool there.
        state = self.__dict__.copy()
        state["_pool"] = None
        del state["_lock"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        parallel = f", num_workers={self.num_workers}, timeout_s={self.timeout_s}" if self.num_workers else ""
        overlong = (
            f", overlong_buffer_len={self.overlong_buffer_len}, overlong_penalty_factor={self.overlong_penalty_factor}"
            if self.overlong_buffer_len is not None else ""
        )
        return (
            f"RewardManager(sources={sorted(self.scorers)}, default={self.default!r}, strict={self.strict}, "
            f"fallback_score={self.fallback_score}{parallel}{overlong})"
        )


def extra_means(row_extras: Sequence[Mapping[str, Any]], data_sources: Sequence[str]) -> dict[str, float]:
    """"reward/extra/<data_source>/<name>/mean": the mean of each numeric extra value (bools as 0/1) over the
    rows of that source that reported it; NaN/inf values are left out (they are counted instead)."""
    sums: dict[str, list[float]] = {}
    for extras, source in zip(row_extras, data_sources):
        for name, value in extras.items():
            if isinstance(value, (int, float)) and math.isfinite(value):
                total = sums.setdefault(f"reward/extra/{source}/{name}/mean", [0.0, 0])
                total[0] += float(value)
                total[1] += 1
    return {key: total / count for key, (total, count) in sums.items()}


def _nonfinite_extras(row_extras: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """"reward/extra_nonfinite" (and per name) counts of NaN/inf numbers among the rows' extra values, with a
    warning naming them; empty when every number is finite."""
    counts: dict[str, int] = {}
    for extras in row_extras:
        for name, value in extras.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isfinite(value):
                counts[name] = counts.get(name, 0) + 1
    if not counts:
        return {}
    logger.warning("reward scorers returned non-finite extra values: %s",
                   ", ".join(f"{name!r} in {n} row(s)" for name, n in sorted(counts.items())))
    return {"reward/extra_nonfinite": float(sum(counts.values())),
            **{f"reward/extra_nonfinite/{name}": float(n) for name, n in counts.items()}}


def _check_picklable(scorers: Mapping[str, Scorer]) -> None:
    """Raise a TypeError naming the first scorer that cannot be sent to a worker process."""
    for name, scorer in scorers.items():
        try:
            pickle.dumps(scorer)
        except (pickle.PicklingError, TypeError, AttributeError) as err:
            which = f"scorer for data_source {name!r}" if name else "default scorer"
            raise TypeError(
                f"RewardManager(num_workers>0): the {which} ({scorer!r}) cannot be "
                f"sent to worker processes: {err}. Fix: define it at module level (a lambda or a function "
                "defined inside another function cannot be pickled); bind options with functools.partial; "
                "or score in-process with num_workers=0."
            ) from err
