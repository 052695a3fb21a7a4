import math
from collections import Counter

import numpy as np
import pytest

from tba.buffer import sampling
from tba.buffer.store import Candidate
from tba.domain import SampleSource

DRAWS = 20_000


def _cands(rewards, versions=None):
    versions = versions or [0] * len(rewards)
    return [Candidate(i + 1, r, v) for i, (r, v) in enumerate(zip(rewards, versions, strict=True))]


def test_plan_sources_draws_recency_with_probability_m():
    rng = np.random.default_rng(0)
    sources = sampling.plan_sources(DRAWS, 0.95, rng)
    share = sources.count(SampleSource.RECENCY) / DRAWS
    assert abs(share - 0.95) < 0.005


@pytest.mark.parametrize("m", [0.0, 1.0])
def test_plan_sources_extremes_are_exact(m):
    sources = sampling.plan_sources(100, m, np.random.default_rng(1))
    expected = SampleSource.RECENCY if m == 1.0 else SampleSource.REWARD
    assert sources == [expected] * 100


def test_first_draw_follows_softmax_of_reward_over_tau():
    rewards, tau = [0.0, 1.0, 2.0], 0.5
    rng = np.random.default_rng(2)
    firsts = Counter(
        sampling.softmax_without_replacement(_cands(rewards), 1, tau, rng)[0] for _ in range(DRAWS)
    )
    weights = [math.exp(r / tau) for r in rewards]
    for i, w in enumerate(weights):
        expected = w / sum(weights)
        assert abs(firsts[i + 1] / DRAWS - expected) < 0.01


def test_second_draw_is_without_replacement_and_renormalised():
    rewards, tau = [0.0, 1.0, 2.0], 1.0
    p = np.exp(np.array(rewards) / tau)
    p /= p.sum()
    rng = np.random.default_rng(3)
    pairs = Counter(
        tuple(sampling.softmax_without_replacement(_cands(rewards), 2, tau, rng))
        for _ in range(DRAWS)
    )
    assert all(a != b for a, b in pairs)
    # P(first = 3, second = 2) = p3 * p2 / (1 - p3)
    expected = p[2] * p[1] / (1 - p[2])
    assert abs(pairs[(3, 2)] / DRAWS - expected) < 0.01


def test_infinite_temperature_is_uniform():
    rng = np.random.default_rng(4)
    firsts = Counter(
        sampling.softmax_without_replacement(_cands([0.0, 5.0, 100.0]), 1, math.inf, rng)[0]
        for _ in range(DRAWS)
    )
    for i in (1, 2, 3):
        assert abs(firsts[i] / DRAWS - 1 / 3) < 0.01


def test_reward_priority_takes_all_when_k_exceeds_history():
    ids = sampling.softmax_without_replacement(_cands([1, 2]), 5, 1.0, np.random.default_rng(5))
    assert sorted(ids) == [1, 2]


def test_recency_takes_k_newest_and_respects_age_cut():
    cands = _cands([0.0] * 6, versions=[1, 1, 2, 3, 3, 1])
    rng = np.random.default_rng(6)
    newest = sampling.select_completions(cands, 3, SampleSource.RECENCY, math.inf, 0, rng)
    assert newest == [6, 5, 4]
    fresh = sampling.select_completions(cands, 3, SampleSource.RECENCY, math.inf, 2, rng)
    assert fresh == [5, 4, 3]


def test_reward_priority_respects_age_cut():
    cands = _cands([0.0] * 4, versions=[0, 5, 0, 5])
    for seed in range(20):
        rng = np.random.default_rng(seed)
        ids = sampling.select_completions(cands, 4, SampleSource.REWARD, 1.0, 5, rng)
        assert sorted(ids) == [2, 4]


def test_min_version_allowed():
    assert sampling.min_version_allowed(10, None) == 0
    assert sampling.min_version_allowed(10, 3) == 7
    assert sampling.min_version_allowed(2, 5) == 0


def test_pick_distinct_is_uniform_without_replacement_and_excludes():
    pool = ["a", "b", "c", "d", "a"]
    rng = np.random.default_rng(7)
    counts: Counter[str] = Counter()
    for _ in range(DRAWS):
        picked = sampling.pick_distinct(pool, 2, {"d"}, rng)
        assert len(set(picked)) == 2 and "d" not in picked
        counts.update(picked)
    for name in "abc":
        assert abs(counts[name] / DRAWS - 2 / 3) < 0.015


def test_pick_distinct_returns_all_when_short():
    picked = sampling.pick_distinct(["a", "b"], 5, [], np.random.default_rng(8))
    assert sorted(picked) == ["a", "b"]


def test_same_seed_same_draw():
    cands = _cands([0.1, 0.5, 0.9, 0.2])
    a = sampling.softmax_without_replacement(cands, 3, 0.3, np.random.default_rng(9))
    b = sampling.softmax_without_replacement(cands, 3, 0.3, np.random.default_rng(9))
    assert a == b
