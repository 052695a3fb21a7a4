"""Retrying an operation while what it needs is briefly unreachable: the buffer client's
calls, the searcher's AddTrajectories on top of them, the trainer's weight publish.

The last attempt runs outside the loop, so its exception is what the caller sees (and
translates); nothing is swallowed."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class Backoff:
    """`retries` attempts after the first: the first retry waits `first_s`, each next one twice
    the wait before it, up to `max_s` (`max_s` = `first_s`: always the same wait)."""

    retries: int
    first_s: float
    max_s: float

    def waits_s(self) -> Iterator[float]:
        wait_s = self.first_s
        for _ in range(self.retries):
            yield wait_s
            wait_s = min(wait_s * 2, self.max_s)


def retry(
    attempt: Callable[[], T],
    backoff: Backoff,
    *,
    retry_on: Callable[[Exception], bool],
    on_retry: Callable[[Exception, int, float], None],
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """What `attempt()` returns, calling it again after each wait of `backoff` while it raises
    an exception `retry_on` accepts; any other exception, or the last attempt's, propagates.
    `on_retry(exception, retry_number, wait_s)` runs before each wait (to log it)."""
    for number, wait_s in enumerate(backoff.waits_s(), start=1):
        try:
            return attempt()
        except Exception as exc:
            if not retry_on(exc):
                raise
            on_retry(exc, number, wait_s)
            sleep(wait_s)
    return attempt()
