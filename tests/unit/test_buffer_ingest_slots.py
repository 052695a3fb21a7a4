"""`[buffer] adds_in_flight`: the service works on at most that many AddTrajectories calls at
once; the others wait their turn, before any of their work, the newest policy version first
unless one has waited `adds_fresh_first_max_wait_s`, and none is lost."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from tba.buffer.config import BufferSettings
from tba.buffer.memory_store import MemoryStore
from tba.buffer.server import store_limits
from tba.buffer.service import BufferService
from tba.buffer.store import DrawnPrompts, PromptDraw
from tba.buffer.waiting import FreshFirstSlots
from tba.domain import AddResult, Prompt, SampleSpec, Trajectory
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


StoreT = TypeVar("StoreT", bound=MemoryStore)


async def service_over(
    store_type: Callable[[BufferSettings], StoreT], settings: BufferSettings
) -> tuple[StoreT, BufferService]:
    """A store of `store_type` and a service over it with `settings`, holding prompt "a"."""
    store = store_type(settings)
    service = BufferService(store, settings)
    await service.put_prompts([Prompt("a", "question")])
    return store, service


def add_task(
    service: BufferService, request_id: str = "r", batch: list[Trajectory] | None = None
) -> asyncio.Task[AddResult]:
    """An add of `batch` (one trajectory of prompt "a" by default) started as a task."""
    return asyncio.create_task(
        service.add_trajectories(
            [trajectory("a")] if batch is None else batch,
            request_id=request_id,
            searcher_id="s1",
            lease_id="",
        )
    )


def test_adds_beyond_the_slots_wait_their_turn_and_all_are_stored():
    async def scenario() -> None:
        store, service = await service_over(HeldStore, BufferSettings(adds_in_flight=2))
        adds = [add_task(service, f"r{c}", [trajectory("a", (c,))]) for c in range(5)]
        await asyncio.sleep(0.05)
        assert store.holding == 2  # two at work, three waiting for a slot
        store.release.set()
        results = await asyncio.gather(*adds)
        assert store.most_held == 2
        assert [r.accepted for r in results] == [1] * 5
        assert (await service.stats()).trajectories == 5

    asyncio.run(scenario())


def test_a_call_waiting_its_turn_converts_what_it_received_only_once_its_turn_comes():
    async def scenario() -> None:
        store, service = await service_over(HeldStore, BufferSettings(adds_in_flight=1))
        converted: list[str] = []

        def conversion(request_id: str, token: int) -> Callable[[], list[Trajectory]]:
            def convert() -> list[Trajectory]:
                converted.append(request_id)
                return [trajectory("a", (token,))]

            return convert

        adds = [
            asyncio.create_task(
                service.add_received(
                    0, conversion(r, token), request_id=r, searcher_id="s1", lease_id=""
                )
            )
            for token, r in enumerate(("r0", "r1"))
        ]
        await asyncio.sleep(0.05)
        assert converted == ["r0"]  # r1 waits for the slot, its request not converted yet
        store.release.set()
        results = await asyncio.gather(*adds)
        assert converted == ["r0", "r1"] and [r.accepted for r in results] == [1, 1]

    asyncio.run(scenario())


class OrderStore(HeldStore):
    """Holds adds as HeldStore does and keeps the versions in the order they came to store."""

    def __init__(self, settings: BufferSettings) -> None:
        super().__init__(settings)
        self.versions: list[int] = []

    async def add_trajectories(self, trajectories: Any, *args: Any, **kwargs: Any) -> AddResult:
        self.versions.append(trajectories[0].policy_version)
        return await super().add_trajectories(trajectories, *args, **kwargs)


def test_waiting_adds_store_newest_policy_version_first_and_in_arrival_order_among_equals():
    async def scenario() -> None:
        store, service = await service_over(OrderStore, BufferSettings(adds_in_flight=1))
        adds = []
        for c, version in enumerate((0, 1, 3, 2, 3)):
            adds.append(add_task(service, f"r{c}", [trajectory("a", (c,), policy_version=version)]))
            await asyncio.sleep(0.01)  # arrive in this order
        store.release.set()
        results = await asyncio.gather(*adds)
        assert store.versions == [0, 3, 3, 2, 1]
        assert [r.accepted for r in results] == [1] * 5

    asyncio.run(scenario())


class Clock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


def holder(
    slots: FreshFirstSlots, taken: list[int], held: asyncio.Event
) -> Callable[[int], Awaitable[None]]:
    """A coroutine that takes a slot for `version`, notes it in `taken` and holds the slot
    until `held` is set."""

    async def hold(version: int) -> None:
        async with slots.slot(version):
            taken.append(version)
            await held.wait()

    return hold


async def taken_order(slots: FreshFirstSlots, versions: list[int], clock: Clock) -> list[int]:
    """The versions in the order `slots` (all held by one holder) grants them, each arriving
    a second after the one before."""
    order: list[int] = []
    held = asyncio.Event()
    hold = holder(slots, order, held)
    tasks = []
    for version in versions:
        tasks.append(asyncio.create_task(hold(version)))
        await asyncio.sleep(0)
        clock.now_s += 1.0
    held.set()
    await asyncio.gather(*tasks)
    return order


def test_an_add_that_waited_the_longest_allowed_goes_before_newer_versions():
    clock = Clock()
    slots = FreshFirstSlots(1, max_wait_s=2.5, clock=clock)
    # 0 holds the slot; 1 arrived at 1 s and has waited 3 s at the release: it goes first.
    assert asyncio.run(taken_order(slots, [0, 1, 5, 4], clock)) == [0, 1, 5, 4]
    slots = FreshFirstSlots(1, max_wait_s=5.0, clock=clock)
    assert asyncio.run(taken_order(slots, [0, 1, 5, 4], clock)) == [0, 5, 4, 1]


def test_without_a_wait_allowed_adds_take_their_turns_in_arrival_order():
    clock = Clock()
    slots = FreshFirstSlots(1, max_wait_s=0.0, clock=clock)
    assert asyncio.run(taken_order(slots, [0, 1, 5, 4], clock)) == [0, 1, 5, 4]


def test_a_cancelled_wait_takes_no_slot_and_a_cancelled_grant_passes_its_slot_on():
    async def scenario() -> None:
        slots = FreshFirstSlots(1, max_wait_s=10.0)
        held, taken = asyncio.Event(), []
        hold = holder(slots, taken, held)

        async def hold_then_cancel_the_next(waiting: list[asyncio.Task[None]]) -> None:
            await hold(0)
            waiting[1].cancel()  # just granted the slot, cancelled before it runs

        waiting: list[asyncio.Task[None]] = []
        first = asyncio.create_task(hold_then_cancel_the_next(waiting))
        await asyncio.sleep(0)
        waiting += [asyncio.create_task(hold(v)) for v in (1, 2, 3)]
        await asyncio.sleep(0)
        waiting[2].cancel()  # cancelled while it waits
        await asyncio.sleep(0)
        held.set()
        await first
        await asyncio.wait_for(asyncio.gather(*waiting, return_exceptions=True), 5.0)
        assert taken == [0, 1]
        await asyncio.wait_for(hold(7), 5.0)  # and the slot is free again
        assert taken == [0, 1, 7]

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


def test_an_add_stores_after_the_draws_running_when_its_turn_came_and_when_it_is_ready():
    async def scenario() -> None:
        store, service = await service_over(HeldDrawStore, BufferSettings())
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
        store, service = await service_over(HeldAddsAndDraws, BufferSettings())
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
