"""A Sample with `min_groups` and `wait_s` waits in the buffer for enough groups (a long poll),
woken by adds it could use, instead of the trainer polling."""

from __future__ import annotations

import asyncio
import time

import pytest

from tba.buffer.config import BufferSettings
from tba.buffer.memory_store import MemoryStore
from tba.buffer.server import store_limits
from tba.buffer.service import BufferService
from tba.buffer.store import DrawnPrompts, PromptDraw
from tba.buffer.waiting import VersionWatch
from tba.domain import Prompt, SampleSpec, WeightVersion
from tba.errors import InvalidArgumentError
from tests.fixtures.data import trajectory

SHA = "a" * 64


def _service(store: MemoryStore | None = None, **settings: float) -> BufferService:
    config = BufferSettings(**settings)
    return BufferService(store or MemoryStore(store_limits(config)), config)


async def _add(service: BufferService, prompt_id: str, version: int = 0) -> None:
    batch = [trajectory(prompt_id, (5, k), policy_version=version) for k in range(2)]
    await service.add_trajectories(
        batch, request_id=f"{prompt_id}-{version}", searcher_id="s1", lease_id=""
    )


def _long_poll(min_groups: int, wait_s: float, **spec: int) -> SampleSpec:
    return SampleSpec(3, 2, 0.5, min_groups=min_groups, wait_s=wait_s, **spec)


def test_a_long_poll_answers_as_soon_as_adds_bring_enough_groups():
    async def scenario() -> None:
        service = _service(sample_recheck_s=30.0)  # only an add can end the wait early
        await service.put_prompts([Prompt("a", "q"), Prompt("b", "q")])
        began = time.monotonic()
        poll = asyncio.create_task(service.sample(_long_poll(2, wait_s=20.0)))
        await _add(service, "a")
        await asyncio.sleep(0.1)
        assert not poll.done()  # one group of the two it waits for
        await _add(service, "b")
        batch = await asyncio.wait_for(poll, 5.0)
        assert sorted(g.prompt.id for g in batch.groups) == ["a", "b"]
        assert 0.05 < batch.waited_s < time.monotonic() - began < 5.0
        assert (await service.stats()).groups_sampled_total == 2  # the draws it answered

    asyncio.run(scenario())


def test_adds_the_draw_cannot_use_do_not_end_the_wait():
    async def scenario() -> None:
        service = _service(sample_recheck_s=30.0)
        await service.put_prompts([Prompt("a", "q")])
        await service.announce_weights(WeightVersion(5, "file:///w/5", SHA, 10, time.time()))
        poll = asyncio.create_task(service.sample(_long_poll(1, 0.6, max_age_versions=1)))
        await asyncio.sleep(0.05)
        await _add(service, "a", version=3)  # older than the one-version bound allows
        await asyncio.sleep(0.2)
        assert not poll.done()
        batch = await asyncio.wait_for(poll, 5.0)
        assert batch.groups == [] and batch.waited_s >= 0.5

    asyncio.run(scenario())


def test_a_wait_that_ends_short_answers_and_counts_what_its_last_draw_selected():
    async def scenario() -> None:
        service = _service(sample_recheck_s=0.1)  # several draws fall short in the wait
        await service.put_prompts([Prompt("a", "q"), Prompt("b", "q")])
        await _add(service, "a")
        batch = await service.sample(_long_poll(2, wait_s=0.5))
        assert [g.prompt.id for g in batch.groups] == ["a"] and batch.waited_s >= 0.4
        assert sorted(t.id for t in batch.groups[0].trajectories) == [1, 2]
        assert (await service.stats()).groups_sampled_total == 1

    asyncio.run(scenario())


def test_a_long_poll_finds_adds_another_process_served_within_the_recheck_interval():
    async def scenario() -> None:
        shared = MemoryStore(store_limits(BufferSettings()))
        trainers, searchers = _service(shared, sample_recheck_s=0.1), _service(shared)
        await searchers.put_prompts([Prompt("a", "q")])
        began = time.monotonic()
        poll = asyncio.create_task(trainers.sample(_long_poll(1, wait_s=20.0)))
        await asyncio.sleep(0.05)
        await _add(searchers, "a")  # wakes nobody in `trainers`
        batch = await asyncio.wait_for(poll, 5.0)
        assert len(batch.groups) == 1 and time.monotonic() - began < 2.0

    asyncio.run(scenario())


def test_without_min_groups_a_sample_answers_at_once():
    async def scenario() -> None:
        service = _service()
        began = time.monotonic()
        batch = await service.sample(_long_poll(0, wait_s=20.0))
        assert batch.groups == [] and batch.waited_s == 0.0
        assert time.monotonic() - began < 1.0

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("min_groups", "wait_s"), [(4, 1.0), (1, -0.1), (1, float("nan")), (1, 60.5)]
)
def test_bad_long_polls_are_refused(min_groups, wait_s):
    service = _service(max_sample_wait_s=60.0)
    with pytest.raises(InvalidArgumentError, match=r"min_groups|wait_s"):
        asyncio.run(service.sample(_long_poll(min_groups, wait_s)))


def test_an_add_wakes_only_the_waiters_whose_versions_it_reaches():
    async def scenario() -> None:
        fresh = VersionWatch()
        with fresh.watch() as new_enough, fresh.watch() as older_ok:
            assert not new_enough.expect(4) and not older_ok.expect(2)
            fresh.reached(3)
            assert older_ok.event.is_set() and not new_enough.event.is_set()
            fresh.reached(4)
            assert new_enough.event.is_set()

    asyncio.run(scenario())


def test_a_version_reached_during_an_attempt_counts_once_the_attempt_says_it_could_use_it():
    async def scenario() -> None:
        fresh = VersionWatch()
        with fresh.watch() as waiter:
            waiter.arm()
            fresh.reached(3)  # while the attempt runs, before it knows what it needs
            assert not waiter.event.is_set()
            assert waiter.expect(3) and not waiter.expect(4)
            waiter.arm()
            assert not waiter.expect(0)

    asyncio.run(scenario())


class CountingStore(MemoryStore):
    def __init__(self) -> None:
        super().__init__(store_limits(BufferSettings()))
        self.draws = 0

    async def draw_prompts(self, draw: PromptDraw) -> DrawnPrompts:
        self.draws += 1
        return await super().draw_prompts(draw)


def test_adds_of_versions_the_first_draw_cannot_use_do_not_draw_again():
    async def scenario() -> None:
        store = CountingStore()
        service = _service(store, sample_recheck_s=30.0)
        await service.put_prompts([Prompt("a", "q"), Prompt("b", "q")])
        await service.announce_weights(WeightVersion(5, "file:///w/5", SHA, 10, time.time()))
        poll = asyncio.create_task(service.sample(_long_poll(1, 5.0, max_age_versions=1)))
        await asyncio.sleep(0.05)
        first = store.draws
        await _add(service, "a", version=2)  # older than the one-version bound allows
        await asyncio.sleep(0.05)
        assert store.draws == first and not poll.done()
        await _add(service, "b", version=4)
        batch = await asyncio.wait_for(poll, 5.0)
        assert [g.prompt.id for g in batch.groups] == ["b"]

    asyncio.run(scenario())
