"""The buffer's history: one point every `history_interval_s` (the buffer's state, and the
trainer's latest step metrics that arrived with its Sample calls), and one point per held-out
evaluation posted to the buffer. Stores keep the points of the last `history_span_s` (Redis:
so a restarted buffer still has them); `GET /v1/history` serves them to the dashboard."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass

from tba.domain import BufferStats, TrainerReport


@dataclass(frozen=True, slots=True)
class Evaluation:
    """Held-out metrics of one weight version (e.g. `tba local`'s accuracy)."""

    version: int
    step: int
    metrics: dict[str, float]


@dataclass(frozen=True, slots=True)
class BufferPoint:
    reward_mean: float
    adds_per_s: float
    samples_per_s: float
    staleness_mean: float
    staleness_max: int
    prompts: int
    trajectories: int
    active_searchers: int
    latest_version: int


@dataclass(frozen=True, slots=True)
class HistoryPoint:
    """An interval point has `buffer` (and `trainer` when a report arrived since the previous
    point); an evaluation point has `evaluation` only."""

    at_s: float
    buffer: BufferPoint | None = None
    trainer: TrainerReport | None = None
    evaluation: Evaluation | None = None


def max_points(span_s: float, interval_s: float) -> int:
    """How many points a store keeps at most: a span of interval points, as many again for
    evaluations (one per version, far fewer in practice)."""
    return 2 * math.ceil(span_s / interval_s)


def buffer_point(stats: BufferStats, *, now_s: float, active_window_s: float) -> BufferPoint:
    """The buffer's state now; a searcher is active when seen within `active_window_s`."""
    ages = stats.staleness()
    counted = sum(ages.values())
    return BufferPoint(
        reward_mean=stats.reward_mean,
        adds_per_s=stats.adds_per_s,
        samples_per_s=stats.samples_per_s,
        staleness_mean=sum(a * n for a, n in ages.items()) / counted if counted else 0.0,
        staleness_max=max((a for a, n in ages.items() if n), default=0),
        prompts=stats.prompts,
        trajectories=stats.trajectories,
        active_searchers=sum(
            1 for s in stats.searchers if now_s - s.last_seen_s <= active_window_s
        ),
        latest_version=stats.latest_version,
    )


def encode_point(point: HistoryPoint) -> str:
    """One JSON object; its keys sorted, so equal points encode equally."""
    return json.dumps(asdict(point), sort_keys=True, separators=(",", ":"))


def decode_point(text: str | bytes) -> HistoryPoint:
    fields = json.loads(text)
    buffer, trainer, evaluation = fields["buffer"], fields["trainer"], fields["evaluation"]
    return HistoryPoint(
        at_s=fields["at_s"],
        buffer=BufferPoint(**buffer) if buffer else None,
        trainer=TrainerReport(**trainer) if trainer else None,
        evaluation=Evaluation(**evaluation) if evaluation else None,
    )
