"""The history's points: what a point says of the buffer's state, and their encoding."""

import pytest

from tba.buffer.history import (
    BufferPoint,
    Evaluation,
    HistoryPoint,
    buffer_point,
    decode_point,
    encode_point,
    max_points,
)
from tba.domain import BufferStats, SearcherInfo, TrainerReport

NOW = 1_700_000_000.0


def stats(**changes: object) -> BufferStats:
    fields: dict = {
        "trajectories": 10,
        "prompts": 4,
        "prompts_with_trajectories": 3,
        "leases_in_flight": 1,
        "reward_mean": 0.5,
        "reward_histogram_edges": [0.0, 1.0],
        "reward_histogram_counts": [10],
        "per_version": {5: 6, 3: 3, 1: 1},
        "latest_version": 5,
        "searchers": [SearcherInfo("s1", NOW - 10, 6), SearcherInfo("s2", NOW - 500, 4)],
        "trajectories_added_total": 10,
        "groups_sampled_total": 2,
        "evicted_total": 0,
        "adds_per_s": 2.5,
        "samples_per_s": 0.5,
    }
    return BufferStats(**{**fields, **changes})


def test_a_point_has_staleness_throughput_and_the_searchers_seen_lately() -> None:
    point = buffer_point(stats(), now_s=NOW, active_window_s=120)
    assert point == BufferPoint(
        reward_mean=0.5,
        adds_per_s=2.5,
        samples_per_s=0.5,
        staleness_mean=pytest.approx((0 * 6 + 2 * 3 + 4 * 1) / 10),
        staleness_max=4,
        prompts=4,
        trajectories=10,
        active_searchers=1,
        latest_version=5,
    )


def test_an_empty_buffer_is_not_stale() -> None:
    point = buffer_point(stats(per_version={}, searchers=[]), now_s=NOW, active_window_s=120)
    assert (point.staleness_mean, point.staleness_max, point.active_searchers) == (0.0, 0, 0)


def test_points_round_trip_through_their_encoding() -> None:
    state = buffer_point(stats(), now_s=NOW, active_window_s=120)
    report = TrainerReport(3, 1.0, 0.1, -2.0, 1e-5, 0.5, 0.3, 0.01)
    for point in (
        HistoryPoint(NOW, buffer=state, trainer=report),
        HistoryPoint(NOW, buffer=state),
        HistoryPoint(NOW + 1, evaluation=Evaluation(2, 8, {"accuracy": 0.25})),
    ):
        assert decode_point(encode_point(point)) == point
        assert decode_point(encode_point(point).encode()) == point


def test_a_store_keeps_a_span_of_interval_points_and_as_many_evaluations() -> None:
    assert max_points(86_400, 5) == 34_560
    assert max_points(10, 3) == 8
