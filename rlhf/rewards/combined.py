"""`CombinedReward`: a weighted sum of several rewards of the same responses.

Each source is anything with `RewardManager`'s interface (`check_sources` and the call),
so a rule reward, a model reward or another combination mix freely::

    CombinedReward({"correct": (1.0, RewardManager(default_scorers())),
                    "format": (0.1, RewardManager({"openai/gsm8k": has_hash_answer}))})

score_i = sum_k weight_k * score_k,i. Each source's own score is reported per row in
extras as "<name>/score" (its extras as "<name>/<key>"), and in metrics as
"reward/<name>/mean"; a source's metric "reward/x" becomes "reward/<name>/x", and
"reward/errors" sums the sources' failures.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

from rlhf.rewards.manager import Reward, RewardOutput


class CombinedReward:
    """Score with every source and sum the scores with their weights."""

    def __init__(self, sources: Mapping[str, tuple[float, Reward]]) -> None:
        """sources: name -> (weight, reward); names appear in extras and metric names."""
        if not sources:
            raise ValueError("CombinedReward: give at least one source, e.g. {'correct': (1.0, manager)}")
        for name, entry in sources.items():
            if not isinstance(name, str) or not name or "/" in name:
                raise ValueError(f"CombinedReward: source names must be non-empty strings without '/', got {name!r}")
            if not (isinstance(entry, tuple) and len(entry) == 2):
                raise TypeError(f"CombinedReward: source {name!r} must be (weight, reward), got {entry!r}")
            weight, reward = entry
            if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
                raise TypeError(
                    f"CombinedReward: the weight of source {name!r} must be a finite number, got {weight!r}"
                )
            if not callable(reward) or not hasattr(reward, "check_sources"):
                raise TypeError(
                    f"CombinedReward: source {name!r} must be a reward such as RewardManager "
                    f"(callable, with check_sources), got {reward!r}"
                )
        self.sources = {name: (float(weight), reward) for name, (weight, reward) in sources.items()}

    def check_sources(self, data_sources: Iterable[str]) -> None:
        """Every source must be able to score every row (raises the first source's error)."""
        data_sources = list(data_sources)
        for _, reward in self.sources.values():
            reward.check_sources(data_sources)

    def check_generation_limit(self, max_new_tokens: int) -> None:
        """Every source that shapes by length must fit the generation limit (see RewardManager)."""
        for _, reward in self.sources.values():
            check = getattr(reward, "check_generation_limit", None)
            if check is not None:
                check(max_new_tokens)

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
        """The weighted sum of the sources' scores, with each source's part in extras and metrics."""
        scores = [0.0] * len(responses)
        extras: dict[str, list] = {}
        metrics: dict[str, float] = {}
        # passed on only when given, so a source written without overlong shaping needs neither keyword
        options = {} if response_lengths is None else {"response_lengths": response_lengths}
        if max_new_tokens is not None:
            options["max_new_tokens"] = max_new_tokens
        for name, (weight, reward) in self.sources.items():
            out = reward(responses, data_sources, ground_truths, extra_infos, **options)
            if len(out.scores) != len(responses):
                raise ValueError(
                    f"CombinedReward: source {name!r} returned {len(out.scores)} scores for {len(responses)} rows"
                )
            scores = [total + weight * s for total, s in zip(scores, out.scores)]
            extras[f"{name}/score"] = list(out.scores)
            extras.update({f"{name}/{key}": column for key, column in out.extras.items()})
            metrics[f"reward/{name}/mean"] = sum(out.scores) / len(out.scores) if out.scores else 0.0
            for key, value in out.metrics.items():
                rest = key.removeprefix("reward/")
                metrics[f"reward/{name}/{rest}" if rest != key else f"{name}/{key}"] = value
        errors = [metrics[f"reward/{name}/errors"] for name in self.sources if f"reward/{name}/errors" in metrics]
        if errors:
            metrics["reward/errors"] = sum(errors)  # all sources' failures, as a RewardManager reports them
        nonfinite = [metrics.get(f"reward/{name}/extra_nonfinite") for name in self.sources]
        if any(nonfinite):
            metrics["reward/extra_nonfinite"] = sum(n for n in nonfinite if n)
        return RewardOutput(scores=scores, extras=extras, metrics=metrics)

    def close(self) -> None:
        """Close every source that has worker processes."""
        for _, reward in self.sources.values():
            close = getattr(reward, "close", None)
            if close is not None:
                close()

    def __enter__(self) -> CombinedReward:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        parts = ", ".join(f"{name!r}: ({weight}, {reward!r})" for name, (weight, reward) in self.sources.items())
        return f"CombinedReward({{{parts}}})"
