"""Calls that wait in the buffer (a long poll) instead of their clients polling: a Sample for
data, woken by the adds it could use (each poll would be a full draw, whose round trips to the
store queue behind the adds' scripts), and a GetLatestWeights for a newer version, woken by
its announcement (a searcher waiting for the trainer's next version learns of it at once)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager, suppress
from typing import TypeVar

T = TypeVar("T")


class VersionWatch:
    """Wakes waiters when this process sees a version they wait for: a waiter names the oldest
    version it accepts; `reached` is told the newest version an add stored (completions of
    that policy version), or one announced. Versions another process on the same store served
    wake nobody here, so each wait is also bounded."""

    def __init__(self) -> None:
        self._waiters: dict[asyncio.Event, int] = {}

    def reached(self, newest_version: int) -> None:
        """This process stored or announced versions up to `newest_version`."""
        for event, min_version in list(self._waiters.items()):
            if newest_version >= min_version:
                event.set()
                del self._waiters[event]

    @contextmanager
    def watch(self, min_version: int) -> Iterator[asyncio.Event]:
        """An event set by the first version of `min_version` or newer reached while the
        block runs: entered before reading the store, so one reached meanwhile is not
        missed."""
        event = asyncio.Event()
        self._waiters[event] = min_version
        try:
            yield event
        finally:
            self._waiters.pop(event, None)


async def wait_for(event: asyncio.Event, timeout_s: float) -> None:
    """Returns when `event` is set or after `timeout_s`, whichever comes first."""
    with suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), timeout_s)


async def long_poll(
    watch: VersionWatch,
    attempt: Callable[[], Awaitable[tuple[T, bool, int]]],
    wait_s: float,
    recheck_s: float,
    first_min_version: int = 0,
) -> tuple[T, float]:
    """Runs `attempt` (its result, whether it is the answer, and the oldest version that
    could change it) until it answers or `wait_s` has passed, waiting in between for `watch`
    to reach that version, at most `recheck_s` at a time (versions another process served
    wake nobody here). The last result, and the seconds before the attempt it came from."""
    first_began_s = began_s = time.monotonic()
    min_version = first_min_version
    while True:
        # Watched from before the attempt: a version reached during it ends the wait at once.
        with watch.watch(min_version) as reached:
            result, answered, min_version = await attempt()
            left_s = first_began_s + wait_s - time.monotonic()
            if answered or left_s <= 0:
                return result, began_s - first_began_s
            await wait_for(reached, min(left_s, recheck_s))
        began_s = time.monotonic()


class DrawGate:
    """An add waits for the draws running when it gets its turn and, again, for those running
    when it is ready to store, never for later ones (so adds cannot starve): a draw's round
    trips then do not queue behind new add scripts in the store. With the trainer
    long-polling, draws are few (one per add it could use), so the adds held back are few."""

    def __init__(self) -> None:
        self._running: set[asyncio.Future[None]] = set()

    @asynccontextmanager
    async def drawing(self) -> AsyncIterator[None]:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._running.add(done)
        try:
            yield
        finally:
            self._running.discard(done)
            done.set_result(None)

    async def after_running_draws(self) -> None:
        """Returns once the draws running now have ended."""
        if self._running:
            await asyncio.wait(list(self._running))
