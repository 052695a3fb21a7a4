"""Per-round sampling temperatures (`[searcher] temperature_low` / `temperature_high`): which
rounds draw one, that the draw is reproducible, and that a round's completions are sampled,
scored and tagged at it."""

from __future__ import annotations

import math

import pytest

from tba.buffer.config import BufferSettings
from tba.buffer.validation import check_trajectory
from tba.searcher.config import SearcherSettings
from tba.searcher.loop import round_temperature
from tests.unit.test_searcher_loop import PROMPTS, RecordingBuffer, make_loop


def test_without_a_range_every_round_samples_at_the_runs_temperature() -> None:
    s = SearcherSettings(temperature=0.9)
    assert {round_temperature(s, [0, 7, r]) for r in range(50)} == {0.9}


def test_a_range_draws_reproducibly_within_its_bounds_on_its_fraction_of_rounds() -> None:
    s = SearcherSettings(temperature=1.0, temperature_low=0.7, temperature_high=2.0)
    drawn = [round_temperature(s, [0, 7, r]) for r in range(400)]
    assert drawn == [round_temperature(s, [0, 7, r]) for r in range(400)]
    own = [t for t in drawn if t != 1.0]
    assert all(0.7 <= t <= 2.0 for t in own) and len(set(own)) == len(own)
    assert 0.4 < len(own) / len(drawn) < 0.6  # the default fraction, Lee et al.'s half
    every = s.model_copy(update={"temperature_draw_fraction": 1.0})
    assert all(round_temperature(every, [0, 7, r]) != 1.0 for r in range(50))
    # Another searcher (or seed) draws other temperatures.
    assert drawn[:20] != [round_temperature(s, [0, 8, r]) for r in range(20)]


def test_a_round_that_draws_samples_scores_and_tags_its_trajectories_at_its_temperature(
    tmp_path,
) -> None:
    buffer = RecordingBuffer(PROMPTS)
    # eos_nats 0: the policy is the reference model, so their log-probs agree at one
    # temperature, the round's, and not at the run's.
    loop = make_loop(
        tmp_path,
        buffer,
        eos_nats=0.0,
        temperature=1.0,
        temperature_low=0.3,
        temperature_high=0.5,
        temperature_draw_fraction=1.0,
    )
    values = loop.round()
    assert values is not None and 0.3 <= values["searcher/temperature"] <= 0.5
    posted = buffer.posted()
    assert posted and {t.sampling_temperature for t in posted} == {values["searcher/temperature"]}
    for t in posted:
        assert t.ref_logprob == pytest.approx(t.behavior_logprob, abs=1e-4)
        check_trajectory(t, "t", BufferSettings())


def test_a_round_at_the_runs_temperature_leaves_its_trajectories_at_0(tmp_path) -> None:
    buffer = RecordingBuffer(PROMPTS)
    loop = make_loop(tmp_path, buffer, eos_nats=0.0, temperature=0.8)
    values = loop.round()
    assert values is not None and values["searcher/temperature"] == 0.8
    posted = buffer.posted()
    assert posted and {t.sampling_temperature for t in posted} == {0.0}
    assert all(math.isclose(t.ref_logprob, t.behavior_logprob, abs_tol=1e-4) for t in posted)
