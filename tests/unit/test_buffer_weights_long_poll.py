"""GetLatestWeights with `newer_than` and `wait_s` waits in the buffer for the next announced
version (a long poll), instead of a searcher polling for it."""

from __future__ import annotations

import asyncio
import time

import pytest

from tba.buffer.config import BufferSettings
from tba.buffer.memory_store import MemoryStore
from tba.buffer.server import store_limits
from tba.buffer.service import BufferService
from tba.domain import WeightVersion
from tba.errors import InvalidArgumentError

SHA = "a" * 64
PUBLISHED_AT_S = 1_800_000_000.0


def _service(store: MemoryStore | None = None, **settings: float) -> BufferService:
    config = BufferSettings(**settings)
    return BufferService(store or MemoryStore(store_limits(config)), config)


def _version(number: int) -> WeightVersion:
    return WeightVersion(number, f"file:///w/{number}", SHA, 2 * number, PUBLISHED_AT_S)


def test_a_weights_long_poll_answers_when_a_newer_version_is_announced():
    async def scenario() -> None:
        service = _service(sample_recheck_s=30.0)  # only an announcement ends the wait early
        await service.announce_weights(_version(1))
        poll = asyncio.create_task(service.newer_weights(1, 20.0))
        await asyncio.sleep(0.1)
        assert not poll.done()
        await service.announce_weights(_version(2))
        latest, waited_s = await asyncio.wait_for(poll, 5.0)
        assert latest == _version(2) and 0.05 < waited_s < 5.0

    asyncio.run(scenario())


def test_a_newer_version_already_announced_answers_at_once():
    async def scenario() -> None:
        service = _service(sample_recheck_s=30.0)
        await service.announce_weights(_version(3))
        assert await asyncio.wait_for(service.newer_weights(1, 20.0), 1.0) == (_version(3), 0.0)
        assert await service.newer_weights(0, 0.0) == (_version(3), 0.0)

    asyncio.run(scenario())


def test_a_weights_long_poll_with_nothing_newer_answers_the_latest_after_its_wait():
    async def scenario() -> None:
        service = _service(sample_recheck_s=30.0)
        assert await service.newer_weights(0, 0.0) == (None, 0.0)  # none announced yet
        await service.announce_weights(_version(1))
        began = time.monotonic()
        latest, waited_s = await service.newer_weights(1, 0.3)
        assert latest == _version(1) and 0.25 < waited_s <= time.monotonic() - began

    asyncio.run(scenario())


def test_a_weights_long_poll_finds_versions_another_process_announced_within_the_recheck():
    async def scenario() -> None:
        shared = MemoryStore(store_limits(BufferSettings()))
        searchers, trainers = _service(shared, sample_recheck_s=0.1), _service(shared)
        poll = asyncio.create_task(searchers.newer_weights(0, 20.0))
        await asyncio.sleep(0.05)
        await trainers.announce_weights(_version(1))  # wakes nobody in `searchers`
        latest, _ = await asyncio.wait_for(poll, 2.0)
        assert latest == _version(1)

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("newer_than", "wait_s"), [(2**53, 1.0), (0, -0.1), (0, float("nan")), (0, 60.5)]
)
def test_bad_weights_long_polls_are_refused(newer_than, wait_s):
    service = _service(max_weights_wait_s=60.0)
    with pytest.raises(InvalidArgumentError, match=r"newer_than|wait_s"):
        asyncio.run(service.newer_weights(newer_than, wait_s))
