"""`[buffer] adds_in_flight`: the service works on at most that many AddTrajectories calls at
once; the others wait their turn, before any of their work, and none is lost."""

from __future__ import annotations

import asyncio
from typing import Any

from tba.buffer.config import BufferSettings
from tba.buffer.memory_store import MemoryStore
from tba.buffer.server import store_limits
from tba.buffer.service import BufferService
from tba.domain import AddResult, Prompt
from tests.fixtures.data import trajectory


class HeldStore(MemoryStore):
    """Holds every add until `release` is set, counting the adds it holds at once."""

    def __init__(self, settings: BufferSettings) -> None:
        super().__init__(store_limits(settings))
        self.release = asyncio.Event()
        self.holding = 0
        self.most_held = 0

    async def add_trajectories(self, *args: Any, **kwargs: Any) -> AddResult:
        self.holding += 1
        self.most_held = max(self.most_held, self.holding)
        await self.release.wait()
        self.holding -= 1
        return await super().add_trajectories(*args, **kwargs)


def test_adds_beyond_the_slots_wait_their_turn_and_all_are_stored():
    async def scenario() -> None:
        settings = BufferSettings(adds_in_flight=2)
        store = HeldStore(settings)
        service = BufferService(store, settings)
        await service.put_prompts([Prompt("a", "question")])
        adds = [
            asyncio.create_task(
                service.add_trajectories(
                    [trajectory("a", (c,))], request_id=f"r{c}", searcher_id="s1", lease_id=""
                )
            )
            for c in range(5)
        ]
        await asyncio.sleep(0.05)
        assert store.holding == 2  # two at work, three waiting for a slot
        store.release.set()
        results = await asyncio.gather(*adds)
        assert store.most_held == 2
        assert [r.accepted for r in results] == [1] * 5
        assert (await service.stats()).trajectories == 5

    asyncio.run(scenario())
