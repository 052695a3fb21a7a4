"""Evaluation's numbers: win rate, perplexity, attack success rate, pairwise diversity."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from tba.eval.metrics import (
    mean,
    mean_pairwise_cosine_distance,
    perplexity,
    success_rate,
    win_rate,
)


def brute_force_distance(vectors: np.ndarray) -> float:
    distances = []
    for a, b in itertools.permutations(vectors, 2):
        na, nb = np.linalg.norm(a), np.linalg.norm(b)
        cosine = 0.0 if na == 0 or nb == 0 else float(a @ b / (na * nb))
        distances.append(1.0 - cosine)
    return float(np.mean(distances))


def test_pairwise_distance_matches_the_definition():
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(7, 5)) * rng.uniform(0.1, 10, size=(7, 1))
    vectors[3] = 0.0
    assert mean_pairwise_cosine_distance(vectors) == pytest.approx(brute_force_distance(vectors))


def test_pairwise_distance_extremes():
    assert mean_pairwise_cosine_distance(np.ones((4, 3))) == pytest.approx(0.0, abs=1e-12)
    assert mean_pairwise_cosine_distance([[1.0, 0.0], [-2.0, 0.0]]) == pytest.approx(2.0)
    assert mean_pairwise_cosine_distance(np.eye(3)) == pytest.approx(1.0)
    assert mean_pairwise_cosine_distance(np.ones((1, 3))) is None
    assert mean_pairwise_cosine_distance(np.ones((0, 3))) is None


def test_win_rate_counts_strict_wins():
    assert win_rate([1.0, 2.0, 3.0, 0.5], [0.0, 2.0, 4.0, 0.0]) == 0.5
    with pytest.raises(ValueError):
        win_rate([1.0], [1.0, 2.0])
    with pytest.raises(ValueError):
        win_rate([], [])


def test_perplexity_and_success_rate():
    assert perplexity(-2 * math.log(4.0), 2) == pytest.approx(4.0)
    assert perplexity(0.0, 3) == 1.0
    with pytest.raises(ValueError):
        perplexity(-1.0, 0)
    assert success_rate([0.2, 0.5, 0.51, 0.9], 0.5) == 0.5
    with pytest.raises(ValueError):
        success_rate([], 0.5)
    assert mean([]) is None
    assert mean([1.0, 2.0]) == 1.5
