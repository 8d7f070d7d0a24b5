"""`RewardManager`: score a batch of responses, each with the scorer of its data source.

The scorers are a plain dict from data_source to function, chosen by whoever builds
the manager (in Python or in the experiment graph), e.g.::

    RewardManager({"openai/gsm8k": gsm8k_score,
                   "countdown": functools.partial(countdown_score, format_score=0.0)})

A scorer is called as `scorer(response, ground_truth, extra_info)` and returns a float,
or a dict with a "score" and any other values to report per row (they become `extras`).
Rows are scored one at a time by `_score_row`, which is the unit a parallel mode
(a process pool with per-row timeouts) will map over.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

logger = logging.getLogger(__name__)

Scorer = Callable[..., "float | dict"]


class UnknownDataSourceError(ValueError):
    """Some rows have a data_source that no scorer is registered for in this manager."""


class ScorerError(RuntimeError):
    """A scorer raised or returned something that is not a score (strict mode)."""


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


class RewardManager:
    """Dispatch each response to the scorer of its data_source and collect the rewards."""

    def __init__(
        self,
        scorers: Mapping[str, Scorer],
        *,
        strict: bool = True,
        fallback_score: float = 0.0,
    ) -> None:
        """
        scorers: data_source -> scorer function (see `rlhf.rewards.default_scorers()`).
        strict: re-raise a scorer failure (with row and data_source); when False, the row
          gets `fallback_score` and the failure is counted in metrics "reward/errors".
        fallback_score: the score of a row whose scorer failed (strict=False only).
        """
        for name, scorer in scorers.items():
            if not callable(scorer):
                raise TypeError(f"RewardManager: the scorer for data_source {name!r} is not callable: {scorer!r}")
        self.scorers = dict(scorers)
        self.strict = strict
        self.fallback_score = float(fallback_score)

    def check_sources(self, data_sources: Iterable[str]) -> None:
        """Raise `UnknownDataSourceError` if any data_source has no scorer (call before training)."""
        unknown = sorted({str(s) for s in data_sources} - set(self.scorers))
        if unknown:
            raise UnknownDataSourceError(
                f"no reward scorer for data_source {', '.join(map(repr, unknown))}; scorers are known "
                f"for {', '.join(map(repr, sorted(self.scorers))) or 'nothing'}. Fix: add the missing "
                "source to the scorers dict given to RewardManager (e.g. {**default_scorers(), "
                f"{unknown[0]!r}: my_score}}), or correct the rows' data_source."
            )

    def __call__(
        self,
        responses: Sequence[str],
        data_sources: Sequence[str],
        ground_truths: Sequence[str],
        extra_infos: Sequence[dict | None],
    ) -> RewardOutput:
        """Score every response; all four sequences are per row and of equal length."""
        lengths = {
            "responses": len(responses),
            "data_sources": len(data_sources),
            "ground_truths": len(ground_truths),
            "extra_infos": len(extra_infos),
        }
        if len(set(lengths.values())) > 1:
            raise ValueError(f"RewardManager: inputs disagree on the number of rows: {lengths}")
        self.check_sources(data_sources)

        scores: list[float] = []
        row_extras: list[dict[str, Any]] = []
        errors: dict[str, int] = {}
        first_error: str | None = None
        for i, (response, source, truth, extra) in enumerate(
            zip(responses, data_sources, ground_truths, extra_infos)
        ):
            try:
                score, extras = self._score_row(source, response, truth, extra)
            except Exception as err:
                message = f"scorer for data_source {source!r} failed on row {i}: {type(err).__name__}: {err}"
                if self.strict:
                    hint = " (RewardManager(strict=False) gives such rows fallback_score instead)"
                    raise ScorerError(message + hint) from err
                errors[source] = errors.get(source, 0) + 1
                first_error = first_error or message
                score, extras = self.fallback_score, {}
            scores.append(score)
            row_extras.append(extras)

        columns = list(dict.fromkeys(k for extras in row_extras for k in extras))
        metrics = {"reward/errors": float(sum(errors.values()))}
        metrics.update({f"reward/errors/{source}": float(n) for source, n in errors.items()})
        if errors:
            logger.warning("%d reward scorer failure(s) given fallback_score=%s; first: %s",
                           sum(errors.values()), self.fallback_score, first_error)
        return RewardOutput(
            scores=scores,
            extras={k: [extras.get(k) for extras in row_extras] for k in columns},
            metrics=metrics,
        )

    def _score_row(self, source: str, response: str, truth: str, extra: dict | None) -> tuple[float, dict]:
        return _as_score(self.scorers[source](response, truth, extra))

    def __repr__(self) -> str:
        return (
            f"RewardManager(sources={sorted(self.scorers)}, strict={self.strict}, "
            f"fallback_score={self.fallback_score})"
        )
