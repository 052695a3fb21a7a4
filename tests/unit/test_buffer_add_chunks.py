"""`[buffer] add_chunk_size`: the service stores a large AddTrajectories call in chunks, each
after the Sample draws running when it is ready, acknowledges the lease with the last one,
and a retry stores only what was not stored yet."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tba.buffer.config import BufferSettings
from tba.buffer.memory_store import MemoryStore
from tba.buffer.server import store_limits
from tba.buffer.service import store_chunks
from tba.domain import AddResult, SampleSpec, Trajectory
from tba.errors import FailedPreconditionError, UnavailableError
from tests.fixtures.data import trajectory
from tests.unit.test_buffer_ingest_slots import HeldDrawStore, add_task, service_over


def batch(size: int, reward: float = 1.0) -> list[Trajectory]:
    return [trajectory("a", (c,), reward=reward) for c in range(size)]


def test_chunks_name_their_place_and_size_and_one_chunk_keeps_the_callers_id():
    chunks = store_chunks(batch(5), "r", 2)
    assert [(i, len(c)) for i, c in chunks] == [("r 0+2", 2), ("r 2+2", 2), ("r 4+1", 1)]
    assert [t.completion_token_ids for _, c in chunks for t in c] == [
        t.completion_token_ids for t in batch(5)
    ]
    assert [i for i, _ in store_chunks(batch(2), "r", 2)] == ["r"]
    assert [i for i, _ in store_chunks(batch(5), "r", 0)] == ["r"]


class RecordingStore(MemoryStore):
    """Keeps each add's (request id, size, lease id); fails the add numbered `fail_at` once."""

    def __init__(self, settings: BufferSettings, fail_at: int | None = None) -> None:
        super().__init__(store_limits(settings))
        self.calls: list[tuple[str, int, str]] = []
        self.fail_at = fail_at

    async def add_trajectories(self, trajectories: Any, **kwargs: Any) -> AddResult:
        self.calls.append((kwargs["request_id"], len(trajectories), kwargs["lease_id"]))
        if len(self.calls) - 1 == self.fail_at:
            raise UnavailableError("store down")
        return await super().add_trajectories(trajectories, **kwargs)


def test_a_large_add_is_stored_in_chunks_and_acknowledges_its_lease_with_the_last():
    async def scenario() -> None:
        settings = BufferSettings(add_chunk_size=2)
        store, service = await service_over(RecordingStore, settings)
        lease = await service.lease_prompts("s1", 1, 60.0)
        result = await service.add_trajectories(
            batch(5), request_id="r", searcher_id="s1", lease_id=lease.lease_id
        )
        assert result == AddResult(accepted=5, replaced_duplicates=0, evicted=0)
        assert [(size, lease_id) for _, size, lease_id in store.calls] == [
            (2, ""),
            (2, ""),
            (1, lease.lease_id),
        ]
        stats = await service.stats()
        assert stats.trajectories == 5 and stats.leases_in_flight == 0

    asyncio.run(scenario())


def test_a_retry_after_a_chunk_failed_stores_only_the_rest_and_then_replays():
    async def scenario() -> None:
        _, service = await service_over(
            lambda s: RecordingStore(s, fail_at=1), BufferSettings(add_chunk_size=2)
        )
        with pytest.raises(UnavailableError):
            await add_task(service, "r", batch(5))
        assert (await service.stats()).trajectories == 2  # the first chunk is in
        retried = await add_task(service, "r", batch(5))
        assert (retried.accepted, retried.replayed) == (5, False)
        again = await add_task(service, "r", batch(5))
        assert (again.accepted, again.replayed) == (5, True)
        assert (await service.stats()).trajectories == 5

    asyncio.run(scenario())


def test_a_request_id_reused_for_another_large_batch_stores_nothing():
    async def scenario() -> None:
        _, service = await service_over(RecordingStore, BufferSettings(add_chunk_size=2))
        await add_task(service, "r", batch(5))
        with pytest.raises(FailedPreconditionError):
            await add_task(service, "r", batch(5, reward=0.0))
        assert (await service.stats()).trajectories == 5

    asyncio.run(scenario())


def test_a_chunk_ready_while_a_draw_runs_stores_after_it():
    async def scenario() -> None:
        store, service = await service_over(HeldDrawStore, BufferSettings(add_chunk_size=2))
        first_stored = asyncio.Event()
        store_chunk = store.add_trajectories

        async def note_first(*args: Any, **kwargs: Any) -> AddResult:
            result = await store_chunk(*args, **kwargs)
            first_stored.set()
            await asyncio.sleep(0.05)  # the draw below starts while this chunk stores
            return result

        store.add_trajectories = note_first  # type: ignore[method-assign]
        add = add_task(service, "r", batch(5))
        await asyncio.wait_for(first_stored.wait(), 5.0)
        draw = asyncio.create_task(service.sample(SampleSpec(1, 1, 0.5)))
        await asyncio.sleep(0.1)
        assert not add.done() and (await service.stats()).trajectories == 2
        store.draws[0].set()
        assert (await asyncio.wait_for(add, 5.0)).accepted == 5
        await draw

    asyncio.run(scenario())
