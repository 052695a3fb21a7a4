"""Evaluation's numbers: win rate, perplexity, attack success rate."""

from __future__ import annotations

import math

import pytest

from tba.eval.metrics import (
    mean,
    perplexity,
    success_rate,
    win_rate,
)


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
