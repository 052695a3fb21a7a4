"""Calls that wait in the buffer (a long poll) instead of their clients polling: a Sample for
data, woken by the adds it could use (each poll would be a full draw, whose round trips to the
store queue behind the adds' scripts), and a GetLatestWeights for a newer version, woken by
its announcement (a searcher waiting for the trainer's next version learns of it at once);
and the adds' turns: after running draws (`DrawGate`), and for a slot, freshest first
(`FreshFirstSlots`)."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager, suppress
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


class Waiter:
    """One long poll's watch: the newest version reached since it was armed, and an event set
    by the first version reached that is at least `min_version` (unknown while an attempt
    runs: the attempt says which versions could change its answer)."""

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.newest = -1
        self.min_version = math.inf

    def arm(self) -> None:
        """Before an attempt: forget what was reached before it."""
        self.event.clear()
        self.newest, self.min_version = -1, math.inf

    def expect(self, min_version: int) -> bool:
        """After an attempt that did not answer: whether a version it could use was reached
        while it ran; if not, the event is set by the first one reached from now."""
        self.min_version = min_version
        return self.newest >= min_version


class VersionWatch:
    """Wakes waiters when this process sees a version they wait for: `reached` is told the
    newest version an add stored (completions of that policy version), or one announced.
    Versions another process on the same store served wake nobody here, so each wait is also
    bounded."""

    def __init__(self) -> None:
        self._waiters: set[Waiter] = set()

    def reached(self, newest_version: int) -> None:
        """This process stored or announced versions up to `newest_version`."""
        for waiter in self._waiters:
            waiter.newest = max(waiter.newest, newest_version)
            if newest_version >= waiter.min_version:
                waiter.event.set()

    @contextmanager
    def watch(self) -> Iterator[Waiter]:
        """A waiter told of every version reached while the block runs."""
        waiter = Waiter()
        self._waiters.add(waiter)
        try:
            yield waiter
        finally:
            self._waiters.discard(waiter)


async def wait_for(event: asyncio.Event, timeout_s: float) -> None:
    """Returns when `event` is set or after `timeout_s`, whichever comes first."""
    with suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), timeout_s)


async def long_poll(
    watch: VersionWatch,
    attempt: Callable[[], Awaitable[tuple[T, bool, int]]],
    wait_s: float,
    recheck_s: float,
) -> tuple[T, float]:
    """Runs `attempt` (its result, whether it is the answer, and the oldest version that
    could change it) until it answers or `wait_s` has passed, waiting in between for `watch`
    to reach that version, at most `recheck_s` at a time (versions another process served
    wake nobody here). The last result, and the seconds before the attempt it came from."""
    first_began_s = began_s = time.monotonic()
    with watch.watch() as waiter:
        while True:
            # Armed before the attempt, so a usable version reached during it is not missed,
            # and judged after it: versions it cannot use (older than it allows) wake nobody.
            waiter.arm()
            result, answered, min_version = await attempt()
            left_s = first_began_s + wait_s - time.monotonic()
            if answered or left_s <= 0:
                return result, began_s - first_began_s
            if not waiter.expect(min_version):
                await wait_for(waiter.event, min(left_s, recheck_s))
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


@dataclass(eq=False)
class _Turn:
    version: int
    arrived_s: float
    granted: asyncio.Future[None]


class FreshFirstSlots:
    """At most `slots` holders at once. While more wait, the next slot goes to the one carrying
    the newest policy version, first come first among equals: when ingest runs short, the
    completions the trainer waits for (at most a version or two old) would otherwise queue
    behind older ones. One that has waited `max_wait_s` goes before any, so none starves
    (0: in order of arrival)."""

    def __init__(
        self, slots: int, max_wait_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._free = slots
        self._max_wait_s = max_wait_s
        self._clock = clock
        self._waiting: list[_Turn] = []  # in order of arrival

    @asynccontextmanager
    async def slot(self, version: int) -> AsyncIterator[None]:
        await self._acquire(version)
        try:
            yield
        finally:
            self._release()

    async def _acquire(self, version: int) -> None:
        if self._free > 0 and not self._waiting:
            self._free -= 1
            return
        turn = _Turn(version, self._clock(), asyncio.get_running_loop().create_future())
        self._waiting.append(turn)
        try:
            await turn.granted
        except asyncio.CancelledError:
            if turn.granted.done() and not turn.granted.cancelled():
                self._release()  # granted, then cancelled before it ran: pass the slot on
            elif turn in self._waiting:
                self._waiting.remove(turn)
            raise

    def _release(self) -> None:
        while self._waiting:
            turn = self._next()
            self._waiting.remove(turn)
            if not turn.granted.done():  # a cancelled one leaves the list when it runs
                turn.granted.set_result(None)
                return
        self._free += 1

    def _next(self) -> _Turn:
        oldest = self._waiting[0]
        if self._clock() - oldest.arrived_s >= self._max_wait_s:
            return oldest
        return max(self._waiting, key=lambda turn: turn.version)  # the first of the newest
