"""The initial buffer fill: before a fresh run's first step, the trainer waits until the buffer
holds `[trainer] initial_buffer_completions` completions (the paper: 500 for GSM8K, 10,000
for TL;DR), so that its first batches are drawn from many prompts and searcher rounds rather
than from the first round to arrive.

The count is the buffer's `BufferStats.trajectories` (completions held now), read through an
injected `StatsSource` (the trainer's buffer client); a shutdown signal ends the wait through
an injected scope (`tba.signals.stop_on_signals`), so this module knows nothing of gRPC or
signals and is tested with fakes.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Protocol

from tba.clock import Clock, SystemClock
from tba.domain import BufferStats

log = logging.getLogger(__name__)

# Progress lines while waiting: often enough to see searchers adding, rarely enough to read.
PROGRESS_EVERY_S = 5.0


class StatsSource(Protocol):
    def stats(self) -> BufferStats: ...


def never_stopped() -> AbstractContextManager[threading.Event]:
    """A stop scope whose event nothing sets: the wait ends only when the buffer is full."""
    return nullcontext(threading.Event())


@dataclass
class InitialFill:
    """Waits until `source` holds `completions` completions, polling every `poll_s`."""

    source: StatsSource
    completions: int
    poll_s: float
    clock: Clock = field(default_factory=SystemClock)
    # Entered for the time of the wait; its event, once set, ends the wait (a shutdown).
    stop_scope: Callable[[], AbstractContextManager[threading.Event]] = never_stopped
    progress_every_s: float = PROGRESS_EVERY_S

    def wait(self) -> int | None:
        """The completions held once there are enough, or None when stopped first."""
        started = self.clock.monotonic()
        logged_at: float | None = None
        with self.stop_scope() as stop:
            while True:
                held = self.source.stats().trajectories
                waited_s = self.clock.monotonic() - started
                if held >= self.completions:
                    log.info("initial buffer fill: %d completions after %.1f s", held, waited_s)
                    return held
                if stop.is_set():
                    log.info(
                        "stopped waiting for the initial buffer fill (%d of %d)",
                        held,
                        self.completions,
                    )
                    return None
                if logged_at is None or waited_s - logged_at >= self.progress_every_s:
                    log.info(
                        "waiting for the initial buffer fill: %d of %d completions (%.0f s)",
                        held,
                        self.completions,
                        waited_s,
                    )
                    logged_at = waited_s
                self.clock.sleep(self.poll_s)
