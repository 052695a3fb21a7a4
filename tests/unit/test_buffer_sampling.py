import math
from collections import Counter

import numpy as np
import pytest

from tba.buffer import sampling
from tba.buffer.store import Candidate, PromptDraw
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


def test_a_round_reads_candidates_from_a_floor_fixed_or_from_its_latest_version():
    def floor(max_age: int | None, min_version: int | None) -> int:
        draw = PromptDraw(4, 1, (0.5,), (), frozenset(), 8, max_age, min_version)
        return sampling.candidate_floor(draw, 10)

    assert floor(None, None) == 0
    assert floor(3, None) == 7
    assert floor(3, 9) == 9  # the draw's first round fixed it; a newer version since is not used
    assert floor(None, 4) == 4


def test_a_round_reads_what_select_completions_can_take_and_no_more():
    # ids 1..6 oldest first; id 5 is an old version posted late
    stored = _cands([0.0, 1.0, 0.0, 1.0, 0.0, 1.0], versions=[3, 4, 4, 5, 2, 5])
    draw = PromptDraw(4, 1, (0.5,), (), frozenset(), 2, 1, None)

    def read(source: SampleSource) -> list[Candidate]:
        return sampling.usable_candidates(reversed(stored), source, draw, floor=4)

    assert read(SampleSource.RECENCY) == [stored[3], stored[5]]  # the newest 2 of version 4+
    assert read(SampleSource.REWARD) == [stored[1], stored[2], stored[3], stored[5]]
    for source in SampleSource:  # what select_completions takes from all it takes from these
        for seed in range(5):
            everything, read_only = (
                sampling.select_completions(c, 2, source, 1.0, 4, np.random.default_rng(seed))
                for c in (stored, read(source))
            )
            assert everything == read_only
    every = PromptDraw(4, 1, (0.5,), (), frozenset(), 0, None, None)
    assert sampling.usable_candidates(reversed(stored), SampleSource.RECENCY, every, 0) == stored


def test_uniform_prefix_is_uniform_without_replacement():
    rng = np.random.default_rng(7)
    counts: Counter[tuple[str, ...]] = Counter()
    for _ in range(DRAWS):
        picked = sampling.uniform_prefix(["a", "b", "c"], rng.random(2).tolist())
        counts[tuple(picked)] += 1
    assert len(counts) == 6  # every ordered pair of distinct items
    for share in counts.values():
        assert abs(share / DRAWS - 1 / 6) < 0.015


def test_uniform_prefix_keeps_the_order_at_zero_and_stops_when_short():
    assert sampling.uniform_prefix(["a", "b", "c"], [0.0, 0.0]) == ["a", "b"]
    assert sampling.uniform_prefix(["a", "b", "c"], [0.9999, 0.0]) == ["c", "b"]
    assert sampling.uniform_prefix(["a", "b"], [0.5, 0.5, 0.5]) == ["b", "a"]
    assert sampling.uniform_prefix([], [0.5]) == []


def _prompt_draw(
    recent: list[float], reward: list[float], wanted_recent: int, exclude: str = ""
) -> PromptDraw:
    return PromptDraw(4, wanted_recent, tuple(recent), tuple(reward), frozenset(exclude))


def test_choose_prompts_by_window_and_rank_excluding():
    window, ranked = ["d", "c", "b", "a"], ["a", "b", "c", "d"]
    draw = _prompt_draw([0.0, 0.5, 0.0], [0.1, 0.1, 0.9], wanted_recent=1, exclude="d")
    chosen = sampling.choose_prompts(window, ranked, draw)
    # recency: "c" (the window less "d", at rank 0); reward: "a", a repeat, "d" excluded
    assert chosen == {
        "c": SampleSource.RECENCY,
        "a": SampleSource.REWARD,
        "b": SampleSource.RECENCY,
    }
    assert list(chosen) == ["c", "b", "a"]  # the window's slot for the short reward side


def test_choose_prompts_stops_when_everything_is_taken():
    draw = _prompt_draw([0.3, 0.6, 0.9], [0.0, 0.5, 0.99] * 3, wanted_recent=1)
    assert sampling.choose_prompts(["a"], ["a"], draw) == {"a": SampleSource.RECENCY}
    assert sampling.choose_prompts([], [], draw) == {}


def test_prompt_draw_gives_a_recency_uniform_per_group_and_spare_reward_ones():
    sources = [SampleSource.RECENCY, SampleSource.REWARD, SampleSource.REWARD]
    draw = sampling.prompt_draw(sources, 16, {"x"}, np.random.default_rng(1))
    assert (draw.window, draw.wanted_recent, draw.exclude) == (16, 1, frozenset({"x"}))
    assert len(draw.recent_uniforms) == 3 and len(draw.reward_uniforms) == 8
    assert all(0 <= u < 1 for u in draw.recent_uniforms + draw.reward_uniforms)


def test_same_seed_same_draw():
    cands = _cands([0.1, 0.5, 0.9, 0.2])
    a = sampling.softmax_without_replacement(cands, 3, 0.3, np.random.default_rng(9))
    b = sampling.softmax_without_replacement(cands, 3, 0.3, np.random.default_rng(9))
    assert a == b
