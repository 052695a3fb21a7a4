"""Sample calls that wait in the buffer for data (a long poll), woken by the adds they could
use instead of the trainer polling: each poll is a full draw, and at many searchers its round
trips to the store queue behind the adds' scripts."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager, suppress


class FreshAdds:
    """Wakes waiters when this process stores completions they could sample: a waiter names
    the oldest policy version it accepts, an add the newest version it stored. Adds served by
    another process on the same store wake nobody here, so each wait is also bounded."""

    def __init__(self) -> None:
        self._waiters: dict[asyncio.Event, int] = {}

    def stored(self, newest_version: int) -> None:
        """An add stored completions of policy versions up to `newest_version`."""
        for event, min_version in list(self._waiters.items()):
            if newest_version >= min_version:
                event.set()
                del self._waiters[event]

    @contextmanager
    def watch(self, min_version: int) -> Iterator[asyncio.Event]:
        """An event set by the first add of `min_version` or newer while the block runs:
        entered before a draw, so an add that lands during the draw is not missed."""
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


class DrawGate:
    """Adds that get their turn while draws run start after those draws end, not after later
    ones (so adds cannot starve): a draw's round trips then do not queue behind new add
    scripts in the store. With the trainer long-polling, draws are few (one per add it could
    use), so the adds held back are few too."""

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
