"""Evaluation math over the n responses sampled for each prompt: mean@n, pass@k, best@k, maj@k,
and bootstrap confidence intervals over prompts.

Every function here scores ONE prompt (its n responses) except `bootstrap_ci`, which resamples
prompts. A data source's metric is the mean of the per-prompt values over its prompts. Pure
Python/numpy: no I/O, no model, no tracking.

Notation: n responses per prompt, c of them correct, k <= n the budget being estimated.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np


def _check_k(n: int, k: int) -> None:
    if n < 1:
        raise ValueError(f"need at least one response per prompt, got n={n}")
    if not 1 <= k <= n:
        raise ValueError(f"k must be in 1..n={n}, got k={k} (sample at least k responses per prompt)")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct (Chen et al. 2021, "Evaluating Large
    Language Models Trained on Code", eq. 1):

        pass@k = 1 - C(n-c, k) / C(n, k)

    the probability that a random k-subset of the n samples holds at least one correct one.
    Computed in the numerically stable product form of the paper's code,

        C(n-c, k) / C(n, k) = prod_{i=n-c+1}^{n} (1 - k / i),

    which never forms the (huge) binomial coefficients; it is 1.0 when n - c < k (every
    k-subset holds a correct sample).
    """
    _check_k(n, k)
    if not 0 <= c <= n:
        raise ValueError(f"c (correct samples) must be in 0..n={n}, got c={c}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def mean_at_n(scores: Sequence[float]) -> float:
    """mean@n: the average score of a prompt's n responses, (1/n) sum_i s_i (verl's `mean@<n>`)."""
    if len(scores) == 0:
        raise ValueError("mean_at_n: no scores")
    return float(sum(scores) / len(scores))


def best_at_k(scores: Sequence[float], k: int) -> float:
    """best@k: the expected maximum score of k responses drawn without replacement from the n.

    With the scores sorted ascending, s_(1) <= ... <= s_(n), the i-th smallest is the maximum
    of exactly C(i-1, k-1) of the C(n, k) subsets, so

        best@k = sum_{i=k}^{n} s_(i) * w_i,   w_i = C(i-1, k-1) / C(n, k)

    exactly (no sampling). The weights are built without binomials, from w_n = k/n and
    w_{i-1} = w_i * (i-k) / (i-1). For 0/1 scores best@k equals `pass_at_k(n, c, k)`. verl's
    `best@k/mean` estimates the same quantity by bootstrap (draws with replacement), so its
    value is lower for k > 1 and random.
    """
    n = len(scores)
    _check_k(n, k)
    ordered = np.sort(np.asarray(scores, dtype=np.float64))
    weights = np.zeros(n)
    weights[n - 1] = k / n
    for i in range(n, k, -1):  # w_{i-1} from w_i; positions are 1-based i -> index i-1
        weights[i - 2] = weights[i - 1] * (i - k) / (i - 1)
    return float(ordered @ weights)


def majority_score(answers: Sequence[Hashable | None], scores: Sequence[float]) -> float:
    """The score of the majority answer among these responses (one vote each).

    Responses whose answer is None (nothing extracted) do not vote; ties go to the answer
    that appears first; the result is the score of the first response giving the winning
    answer (verl's `calc_maj_val`). 0.0 when no response has an answer.
    """
    counts: dict[Hashable, int] = {}
    first: dict[Hashable, float] = {}
    for answer, score in zip(answers, scores, strict=True):
        if answer is None:
            continue
        counts[answer] = counts.get(answer, 0) + 1
        first.setdefault(answer, float(score))
    if not counts:
        return 0.0
    winner = max(counts, key=counts.__getitem__)  # max keeps the first of equal counts
    return first[winner]


def maj_at_k(
    answers: Sequence[Hashable | None],
    scores: Sequence[float],
    k: int,
    num_subsets: int = 1000,  # k-subsets sampled when there are more than this many
    seed: int = 0,
) -> float:
    """maj@k: the expected `majority_score` of k responses drawn without replacement from the n.

        maj@k = (1 / C(n, k)) sum_{S subset of 1..n, |S| = k} majority_score(S)

    computed exactly by enumerating the subsets when C(n, k) <= num_subsets, otherwise
    estimated from `num_subsets` uniformly random k-subsets drawn with a seeded RNG (verl
    estimates its `maj@k/mean` by bootstrap with replacement instead). At k = n it is the
    majority vote over all responses. The votes of all subsets are counted at once (numpy);
    `majority_score` is the reference it is tested against.
    """
    n = len(answers)
    if len(scores) != n:
        raise ValueError(f"maj_at_k: {n} answers but {len(scores)} scores")
    _check_k(n, k)
    if math.comb(n, k) <= num_subsets:
        subsets = np.array(list(itertools.combinations(range(n), k)), dtype=np.int64).reshape(-1, k)
    else:
        rng = np.random.default_rng(seed)
        subsets = np.sort(rng.permuted(np.tile(np.arange(n), (num_subsets, 1)), axis=1)[:, :k], axis=1)
    return float(np.mean(_majority_scores(answers, scores, subsets)))


def _majority_scores(answers: Sequence[Hashable | None], scores: Sequence[float], subsets: np.ndarray) -> np.ndarray:
    """`majority_score` of every row of `subsets` (S,k) of response indices, vectorised: (S,)."""
    ids: dict[Hashable, int] = {}
    codes = np.array([-1 if a is None else ids.setdefault(a, len(ids)) for a in answers], dtype=np.int64)
    values = np.asarray(scores, dtype=np.float64)
    num_subsets, k = subsets.shape
    out = np.zeros(num_subsets)
    if not ids:
        return out
    chunk = max(1, 2**24 // (k * len(ids)))  # bound the (chunk, k, answers) vote tensor
    for start in range(0, num_subsets, chunk):
        rows = subsets[start : start + chunk]
        votes = codes[rows][:, :, None] == np.arange(len(ids))[None, None, :]  # (s,k,U)
        counts = votes.sum(axis=1)  # (s,U)
        first = np.where(votes.any(axis=1), votes.argmax(axis=1), k)  # first position of each answer
        top = counts.max(axis=1, keepdims=True)
        position = np.where((counts == top) & (counts > 0), first, k).min(axis=1)  # ties: seen first
        voted = top[:, 0] > 0
        picked = rows[np.arange(len(rows)), np.minimum(position, k - 1)]
        out[start : start + len(rows)] = np.where(voted, values[picked], 0.0)
    return out


def bootstrap_ci(
    values_per_prompt: Sequence[Any],
    stat_fn: Callable[[Sequence[Any]], float] = np.mean,
    n_boot: int = 1000,  # bootstrap resamples
    alpha: float = 0.05,  # 1 - confidence level: 0.05 gives a 95% interval
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap confidence interval (Efron & Tibshirani 1993) of `stat_fn` over prompts.

    Draws `n_boot` resamples of the P prompts with replacement, computes the statistic on each,
    and returns the alpha/2 and 1 - alpha/2 quantiles (low, high). Prompts, not responses, are
    resampled: the n responses of one prompt are correlated, so treating them as independent
    would give intervals that are too narrow. `values_per_prompt` holds one item per prompt (a
    number such as its pass@k, or anything `stat_fn` accepts a list of).
    """
    items = list(values_per_prompt)
    if not items:
        raise ValueError("bootstrap_ci: no prompts")
    if not 0 < alpha < 1:
        raise ValueError(f"bootstrap_ci: alpha must be in (0, 1), got {alpha}")
    if n_boot < 1:
        raise ValueError(f"bootstrap_ci: n_boot must be >= 1, got {n_boot}")
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(items), size=(n_boot, len(items)))
    if all(isinstance(v, (int, float, np.number)) for v in items):
        array = np.asarray(items, dtype=np.float64)
        if stat_fn is np.mean:  # the common case, vectorised
            stats = array[draws].mean(axis=1)
        else:
            stats = np.array([stat_fn(array[row]) for row in draws], dtype=np.float64)
    else:
        stats = np.array([stat_fn([items[i] for i in row]) for row in draws], dtype=np.float64)
    low, high = np.quantile(stats, [alpha / 2, 1 - alpha / 2])
    return float(low), float(high)
