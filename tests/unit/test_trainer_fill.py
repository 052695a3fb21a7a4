"""The initial buffer fill: the wait on a fake buffer's stats and a fake clock, and where the
training loop runs it (a fresh run only; a shutdown during it ends the run untrained)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest

from tba.domain import Batch, BufferStats, SampleSpec, WeightVersion
from tba.trainer.checkpoint import LoopState
from tba.trainer.config import TrainerSettings
from tba.trainer.fill import InitialFill
from tba.trainer.loop import TrainerLoop
from tba.trainer.publish import PublishProgress


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def monotonic(self) -> float:
        return self.now_s

    def time(self) -> float:
        return 1_700_000_000.0 + self.now_s

    def sleep(self, seconds: float) -> None:
        self.now_s += seconds


class FakeStats:
    """A buffer holding `counts[i]` completions at the i-th call (the last one after)."""

    def __init__(self, *counts: int, on_call: Any = None) -> None:
        self.counts = list(counts)
        self.calls = 0
        self.on_call = on_call

    def stats(self) -> BufferStats:
        held = self.counts[min(self.calls, len(self.counts) - 1)]
        self.calls += 1
        if self.on_call is not None:
            self.on_call(self.calls)
        return BufferStats(
            trajectories=held,
            prompts=0,
            prompts_with_trajectories=0,
            leases_in_flight=0,
            reward_mean=0.0,
            reward_histogram_edges=[0.0, 1.0],
            reward_histogram_counts=[held],
            per_version={},
            latest_version=0,
            searchers=[],
            trajectories_added_total=held,
            groups_sampled_total=0,
            evicted_total=0,
        )


def stoppable() -> tuple[threading.Event, Any]:
    event = threading.Event()

    @contextmanager
    def scope() -> Iterator[threading.Event]:
        yield event

    return event, scope


def test_the_wait_polls_until_the_buffer_holds_enough_and_logs_progress(caplog):
    clock = FakeClock()
    source = FakeStats(0, 120, 120, 300, 499, 500, 700)
    fill = InitialFill(source, 500, poll_s=2.0, clock=clock, progress_every_s=5.0)
    with caplog.at_level(logging.INFO, logger="tba.trainer.fill"):
        assert fill.wait() == 500
    assert source.calls == 6 and clock.now_s == 10.0  # five polls of 2 s
    lines = [r.getMessage() for r in caplog.records]
    # Progress at the start and every 5 s (at 0, 6 s), then the count it went on with.
    assert lines == [
        "waiting for the initial buffer fill: 0 of 500 completions (0 s)",
        "waiting for the initial buffer fill: 300 of 500 completions (6 s)",
        "initial buffer fill: 500 completions after 10.0 s",
    ]


def test_a_full_buffer_passes_without_sleeping():
    clock = FakeClock()
    assert InitialFill(FakeStats(10_000), 10_000, poll_s=1.0, clock=clock).wait() == 10_000
    assert clock.now_s == 0.0


def test_a_shutdown_ends_the_wait():
    event, scope = stoppable()
    source = FakeStats(3, on_call=lambda calls: calls == 2 and event.set())
    fill = InitialFill(source, 500, poll_s=0.5, clock=FakeClock(), stop_scope=scope)
    assert fill.wait() is None
    assert source.calls == 2


@dataclass
class FakeEngine:
    rank: int = 0

    def broadcast(self, value: Any) -> Any:
        return value


@dataclass
class FakePublisher:
    published_steps: list[int] = field(default_factory=list)
    closed: bool = False

    def publish(self, step: int, after_version: int) -> None:
        self.published_steps.append(step)

    def progress(self) -> PublishProgress:
        step = self.published_steps[-1] if self.published_steps else 0
        return PublishProgress(announced=WeightVersion(len(self.published_steps), "", "", step, 0))

    def drain(self) -> PublishProgress:
        return self.progress()

    def close(self, wait: bool = True) -> None:
        self.closed = True


class NoBatches:
    def sample(self, spec: SampleSpec) -> Batch:
        raise AssertionError("the loop drew a batch")


@dataclass
class Metrics:
    lines: list[tuple[int, dict[str, float]]] = field(default_factory=list)

    def write(self, step: int, values: dict[str, float]) -> None:
        self.lines.append((step, dict(values)))

    def close(self) -> None:
        return None


def loop_with(fill: InitialFill, state: LoopState | None = None) -> TrainerLoop:
    """A loop whose collaborators past the fill are fakes that training would trip."""
    clock = fill.clock
    return TrainerLoop(
        settings=TrainerSettings(steps=4, initial_buffer_completions=fill.completions),
        engine=FakeEngine(),  # type: ignore[arg-type]
        source=NoBatches(),
        publisher=FakePublisher(),
        metrics=Metrics(),
        objective=None,  # type: ignore[arg-type]
        reference=None,  # type: ignore[arg-type]
        pad_token_id=0,
        temperature=1.0,
        clock=clock,
        state=state or LoopState(),
        initial_fill=fill,
    )


def test_a_fresh_run_waits_and_logs_the_fill_at_step_0():
    clock = FakeClock()
    loop = loop_with(InitialFill(FakeStats(0, 0, 40), 32, poll_s=1.5, clock=clock))
    assert loop.wait_for_initial_fill() is True
    assert loop.metrics.lines == [  # type: ignore[attr-defined]
        (0, {"time/initial_fill_s": 3.0, "trainer/initial_fill_completions": 40.0})
    ]


def test_a_run_resumed_past_step_0_does_not_wait():
    source = FakeStats(0)
    loop = loop_with(InitialFill(source, 32, poll_s=1.0, clock=FakeClock()), LoopState(step=3))
    assert loop.wait_for_initial_fill() is True
    assert source.calls == 0 and loop.metrics.lines == []  # type: ignore[attr-defined]


def test_a_shutdown_during_the_fill_ends_the_run_before_its_first_step():
    event, scope = stoppable()
    source = FakeStats(5, on_call=lambda calls: calls == 3 and event.set())
    loop = loop_with(InitialFill(source, 32, poll_s=1.0, clock=FakeClock(), stop_scope=scope))
    state = loop.run()  # NoBatches: no batch is drawn
    assert state.step == 0
    publisher = loop.publisher
    assert isinstance(publisher, FakePublisher)
    assert publisher.published_steps == [0] and publisher.closed  # only the starting weights
    assert loop.metrics.lines == []  # type: ignore[attr-defined]


@pytest.mark.parametrize("value", [-1, 1_000_001])
def test_the_setting_is_bounded(value):
    with pytest.raises(ValueError, match="initial_buffer_completions"):
        TrainerSettings(initial_buffer_completions=value)
