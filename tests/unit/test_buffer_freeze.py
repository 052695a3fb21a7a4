"""`[buffer] freeze_growth_after_step`: the service freezes the store's growth once the
trainer's report (sent with each Sample) reaches the step; the store's eviction is the
contract suite's (tests/integration/test_store_contract.py)."""

from __future__ import annotations

import asyncio

import pytest

from tba.buffer.config import BufferSettings
from tba.buffer.memory_store import MemoryStore
from tba.buffer.server import store_limits
from tba.buffer.service import BufferService, growth_freeze_due
from tba.domain import Prompt, SampleSpec, TrainerReport
from tests.fixtures.data import trajectory


@pytest.mark.parametrize(
    ("step", "after", "due"),
    [(0, 0, False), (5000, 0, False), (3999, 4000, False), (4000, 4000, True), (4001, 4000, True)],
)
def test_growth_freezes_from_the_reported_step_on_and_never_at_zero(step, after, due):
    assert growth_freeze_due(step, after) is due


def report(step: int) -> TrainerReport:
    return TrainerReport(step, 1.0, 0.0, 0.0, 1e-4, 1.0, 0.1, 0.0)


def test_the_buffer_stops_growing_once_the_trainer_reports_the_step():
    async def scenario() -> None:
        settings = BufferSettings(freeze_growth_after_step=2)
        service = BufferService(MemoryStore(store_limits(settings)), settings)
        await service.put_prompts([Prompt("a", "question")])

        async def add(*completions: int) -> None:
            trajectories = [trajectory("a", (c,)) for c in completions]
            await service.add_trajectories(
                trajectories, request_id=f"r{completions[0]}", searcher_id="s1", lease_id=""
            )

        async def sample(step: int | None) -> int:
            spec = SampleSpec(1, 10, 0.5, seed=0, report=None if step is None else report(step))
            await service.sample(spec)
            return (await service.stats()).trajectories

        await add(1, 2)
        assert await sample(None) == 2 and await sample(1) == 2
        await add(3)
        assert service.frozen_capacity is None
        assert await sample(2) == 3  # step 2 reported: frozen at the 3 held now
        assert service.frozen_capacity == 3
        await add(4, 5)
        assert await sample(3) == 3  # accepted, the oldest evicted
        assert (await service.stats()).evicted_total == 2

    asyncio.run(scenario())
