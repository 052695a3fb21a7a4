"""The clock the searcher's and the trainer's loops read and sleep on, injected so that tests
can run them on a fake one."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds for durations (phase times, timeouts)."""
        ...

    def time(self) -> float:
        """Unix time in seconds, for timestamps (a trajectory's `created_at_s`)."""
        ...

    def sleep(self, seconds: float) -> None: ...


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def time(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)
