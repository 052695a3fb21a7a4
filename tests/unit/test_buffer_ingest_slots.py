"""`[buffer] adds_in_flight`: the service works on at most that many AddTrajectories calls at
once; the others wait their turn, before any of their work, and none is lost."""

from __future__ import annotations

import asyncio
from typing import Any

from tba.buffer.config import BufferSettings
from tba.buffer.memory_store import MemoryStore
from tba.buffer.server import store_limits
from tba.buffer.service import BufferService
from tba.buffer.store import DrawnPrompts, PromptDraw
from tba.domain import AddResult, Prompt, SampleSpec
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


class HeldDrawStore(MemoryStore):
    """Holds each Sample draw (at its prompt choice) until its own event is set."""

    def __init__(self, settings: BufferSettings) -> None:
        super().__init__(store_limits(settings))
        self.draws: list[asyncio.Event] = []

    async def draw_prompts(self, draw: PromptDraw) -> DrawnPrompts:
        self.draws.append(asyncio.Event())
        await self.draws[-1].wait()
        return await super().draw_prompts(draw)


def add_task(service: BufferService, request_id: str = "r") -> asyncio.Task[AddResult]:
    return asyncio.create_task(
        service.add_trajectories(
            [trajectory("a")], request_id=request_id, searcher_id="s1", lease_id=""
        )
    )


def test_an_add_stores_after_the_draws_running_when_its_turn_came_and_when_it_is_ready():
    async def scenario() -> None:
        settings = BufferSettings()
        store = HeldDrawStore(settings)
        service = BufferService(store, settings)
        await service.put_prompts([Prompt("a", "question")])
        first = asyncio.create_task(service.sample(SampleSpec(1, 1, 0.5)))
        await asyncio.sleep(0.01)
        add = add_task(service)
        await asyncio.sleep(0.01)
        second = asyncio.create_task(service.sample(SampleSpec(1, 1, 0.5)))
        await asyncio.sleep(0.05)
        assert not add.done() and (await service.stats()).trajectories == 0
        store.draws[0].set()  # the draw running when the add's turn came ends...
        await asyncio.sleep(0.05)
        assert not add.done()  # ...and the add, ready to store, waits for the second one
        store.draws[1].set()
        assert (await asyncio.wait_for(add, 5.0)).accepted == 1
        await asyncio.gather(first, second)

    asyncio.run(scenario())


class HeldAddsAndDraws(HeldDrawStore):
    """Holds draws as HeldDrawStore does, and adds inside the store until `release` is set."""

    def __init__(self, settings: BufferSettings) -> None:
        super().__init__(settings)
        self.release = asyncio.Event()
        self.storing = asyncio.Event()

    async def add_trajectories(self, *args: Any, **kwargs: Any) -> AddResult:
        self.storing.set()
        await self.release.wait()
        return await super().add_trajectories(*args, **kwargs)


def test_a_draw_that_starts_while_an_add_stores_does_not_hold_it_back():
    async def scenario() -> None:
        settings = BufferSettings()
        store = HeldAddsAndDraws(settings)
        service = BufferService(store, settings)
        await service.put_prompts([Prompt("a", "question")])
        add = add_task(service)
        await asyncio.wait_for(store.storing.wait(), 5.0)
        draw = asyncio.create_task(service.sample(SampleSpec(1, 1, 0.5)))
        await asyncio.sleep(0.01)
        store.release.set()
        assert (await asyncio.wait_for(add, 5.0)).accepted == 1
        assert not draw.done()
        store.draws[0].set()
        await draw

    asyncio.run(scenario())
