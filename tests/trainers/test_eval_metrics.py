"""pass@k, best@k, maj@k and bootstrap intervals: hand-computed values, brute force, properties."""

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlhf.trainers.eval_metrics import best_at_k, bootstrap_ci, maj_at_k, majority_score, mean_at_n, pass_at_k


@st.composite
def n_c_k(draw, max_n=40):
    n = draw(st.integers(1, max_n))
    return n, draw(st.integers(0, n)), draw(st.integers(1, n))


# ------------------------------------------------------------------------------ pass@k


@pytest.mark.parametrize(
    "n, c, k, expected",
    [
        (4, 1, 2, 0.5),  # 1 - C(3,2)/C(4,2) = 1 - 3/6
        (5, 2, 2, 0.7),  # 1 - C(3,2)/C(5,2) = 1 - 3/10
        (4, 2, 2, 5 / 6),  # 1 - C(2,2)/C(4,2) = 1 - 1/6
        (10, 3, 1, 0.3),  # c/n
        (10, 0, 5, 0.0),  # nothing correct
        (3, 2, 2, 1.0),  # n - c = 1 < k: every pair holds a correct sample
        (8, 8, 8, 1.0),
    ],
)
def test_pass_at_k_hand_computed(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_is_stable_where_binomials_overflow_floats():
    # C(2000, 1000) ~ 1e600 overflows a float; the product form does not.
    exact = 1 - Fraction(math.comb(1200, 1000), math.comb(2000, 1000))
    assert pass_at_k(2000, 800, 1000) == pytest.approx(float(exact), rel=1e-9)
    exact = 1 - Fraction(math.comb(1000, 100), math.comb(1024, 100))
    assert pass_at_k(1024, 24, 100) == pytest.approx(float(exact), rel=1e-9)


@pytest.mark.parametrize("n, c, k", [(4, 5, 1), (4, -1, 1), (4, 2, 0), (4, 2, 5), (0, 0, 1)])
def test_pass_at_k_rejects_impossible_arguments(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


@given(n_c_k())
def test_pass_at_k_is_a_probability_and_c_over_n_at_k_1(nck):
    n, c, k = nck
    assert 0.0 <= pass_at_k(n, c, k) <= 1.0
    assert pass_at_k(n, c, 1) == pytest.approx(c / n, abs=1e-12)
    assert pass_at_k(n, n, k) == 1.0


@given(n_c_k())
def test_pass_at_k_is_monotone_in_k_and_c(nck):
    n, c, k = nck
    if k < n:
        assert pass_at_k(n, c, k + 1) >= pass_at_k(n, c, k)
    if c < n:
        assert pass_at_k(n, c + 1, k) >= pass_at_k(n, c, k)


@given(n_c_k(max_n=9))
def test_pass_at_k_equals_brute_force_over_subsets(nck):
    n, c, k = nck
    correct = [i < c for i in range(n)]
    subsets = list(itertools.combinations(range(n), k))
    brute = sum(any(correct[i] for i in s) for s in subsets) / len(subsets)
    assert pass_at_k(n, c, k) == pytest.approx(brute, abs=1e-12)


# ------------------------------------------------------------------------ mean / best@k


def test_mean_and_best_at_k_hand_computed():
    assert mean_at_n([1.0, 0.0, 0.5, 0.5]) == 0.5
    # pairs of [0, 0.5, 1]: max(0, .5) = .5, max(0, 1) = 1, max(.5, 1) = 1 -> 2.5 / 3
    assert best_at_k([0.0, 1.0, 0.5], 2) == pytest.approx(2.5 / 3)
    assert best_at_k([0.2, 0.9, 0.4], 1) == pytest.approx(0.5)  # k = 1 is the mean
    assert best_at_k([0.2, 0.9, 0.4], 3) == pytest.approx(0.9)  # k = n is the max


@given(st.lists(st.sampled_from([0.0, 0.25, 0.5, 1.0]), min_size=1, max_size=8), st.data())
def test_best_at_k_equals_brute_force(scores, data):
    k = data.draw(st.integers(1, len(scores)))
    subsets = list(itertools.combinations(scores, k))
    assert best_at_k(scores, k) == pytest.approx(sum(max(s) for s in subsets) / len(subsets), abs=1e-12)


@given(n_c_k(max_n=30))
def test_best_at_k_of_binary_scores_is_pass_at_k(nck):
    n, c, k = nck
    assert best_at_k([1.0] * c + [0.0] * (n - c), k) == pytest.approx(pass_at_k(n, c, k), abs=1e-12)


# -------------------------------------------------------------------------------- maj@k


def test_majority_score_votes_ties_and_abstentions():
    assert majority_score(["a", "b", "b"], [1.0, 0.0, 0.0]) == 0.0  # "b" wins 2:1
    assert majority_score(["a", "b"], [1.0, 0.0]) == 1.0  # a tie goes to the first answer
    assert majority_score([None, None, "x"], [0.0, 0.0, 1.0]) == 1.0  # no answer: no vote
    assert majority_score([None, None], [0.0, 0.0]) == 0.0


def test_maj_at_k_hand_computed():
    answers, scores = ["5", "5", "4", "3"], [1.0, 1.0, 0.0, 0.0]
    assert maj_at_k(answers, scores, 4) == 1.0
    # pairs: (5,5) (5,4) (5,3) (5,4) (5,3) -> "5" wins (alone or first in a tie), (4,3) -> "4": 5/6
    assert maj_at_k(answers, scores, 2) == pytest.approx(5 / 6)
    assert maj_at_k(answers, scores, 1) == pytest.approx(0.5)  # one response: its own score
    answers, scores = ["1", "2", "2", "5"], [0.0, 0.0, 0.0, 1.0]
    assert maj_at_k(answers, scores, 4) == 0.0  # "2" wins, and it is wrong
    # the only correct answer "5" comes last, so it loses every tie: no pair votes for it -> 0
    assert maj_at_k(answers, scores, 2) == 0.0


def test_maj_at_k_samples_subsets_with_a_seed_when_there_are_many():
    rng = np.random.default_rng(1)
    answers = [str(x) for x in rng.integers(0, 3, size=12)]
    scores = [1.0 if a == "0" else 0.0 for a in answers]
    exact = maj_at_k(answers, scores, 5, num_subsets=10_000)  # C(12,5) = 792 subsets: enumerated
    sampled = maj_at_k(answers, scores, 5, num_subsets=400, seed=3)
    assert sampled == maj_at_k(answers, scores, 5, num_subsets=400, seed=3)  # reproducible
    assert sampled == pytest.approx(exact, abs=0.08)


# ---------------------------------------------------------------------------- bootstrap


def test_bootstrap_ci_of_a_constant_is_the_constant():
    assert bootstrap_ci([0.7] * 20) == (pytest.approx(0.7), pytest.approx(0.7))


def test_bootstrap_ci_of_a_coin_has_the_normal_width():
    values = [0.0, 1.0] * 50  # mean 0.5, standard error sqrt(.25 / 100) = 0.05
    low, high = bootstrap_ci(values, np.mean, n_boot=2000, alpha=0.05, seed=0)
    assert low == pytest.approx(0.5 - 1.96 * 0.05, abs=0.02)
    assert high == pytest.approx(0.5 + 1.96 * 0.05, abs=0.02)
    values = np.random.default_rng(0).random(37).tolist()
    assert bootstrap_ci(values, seed=0) == bootstrap_ci(values, seed=0)  # seeded
    assert bootstrap_ci(values, seed=0) != bootstrap_ci(values, seed=1)


def test_bootstrap_ci_resamples_prompts_for_any_statistic():
    per_prompt = [[1.0, 1.0], [0.0, 0.0], [1.0, 0.0]]  # items are whole prompts

    def pooled_mean(prompts):
        return float(np.mean([s for p in prompts for s in p]))

    low, high = bootstrap_ci(per_prompt, pooled_mean, n_boot=500, seed=0)
    assert 0.0 <= low <= 0.5 <= high <= 1.0
    with pytest.raises(ValueError):
        bootstrap_ci([])


@given(st.lists(st.floats(0, 1), min_size=1, max_size=30), st.floats(0.01, 0.5))
def test_bootstrap_ci_is_ordered_and_within_the_data(values, alpha):
    low, high = bootstrap_ci(values, np.mean, n_boot=200, alpha=alpha)
    assert min(values) - 1e-12 <= low <= high <= max(values) + 1e-12


@given(st.lists(st.sampled_from([None, "a", "b", "c"]), min_size=1, max_size=8), st.data())
def test_maj_at_k_counts_votes_as_the_reference_does(answers, data):
    scores = data.draw(st.lists(st.sampled_from([0.0, 0.5, 1.0]), min_size=len(answers), max_size=len(answers)))
    k = data.draw(st.integers(1, len(answers)))
    subsets = list(itertools.combinations(range(len(answers)), k))
    reference = sum(majority_score([answers[i] for i in s], [scores[i] for i in s]) for s in subsets) / len(subsets)
    assert maj_at_k(answers, scores, k) == pytest.approx(reference, abs=1e-12)
