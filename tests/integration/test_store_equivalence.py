"""The two stores agree step for step under mixed batches: random adds in which de-duplication,
per-prompt history eviction and capacity eviction meet inside one batch, the same batches
applied to a MemoryStore and to a RedisStore on a real redis-server, and everything a reader
can see compared after each add. The contract tests pin each rule alone; this one catches a
store that applies them in another order (add_trajectories.lua defers its writes to the end
of the batch)."""

from __future__ import annotations

import asyncio
import random
import uuid
from typing import Any

import pytest

from tba.buffer import codec
from tba.buffer.store import BufferStore, StoreLimits, open_buffer_store
from tba.domain import Prompt, Trajectory
from tests.fixtures.data import trajectory
from tests.fixtures.store_reads import by_rank, candidates, recent_prompt_ids

NOW = 1_700_000_000.0
PROMPTS = [f"p{n}" for n in range(6)]
UNIFORMS = [n / 20 for n in range(20)]


def random_batch(rng: random.Random) -> list[Trajectory]:
    """Up to 12 trajectories over a few prompts, completions drawn from a small set so that
    identical ones meet within a batch and across batches."""
    return [
        trajectory(
            rng.choice(PROMPTS),
            completion=(rng.randrange(4), 2),
            reward=rng.choice((0.0, 0.25, 1.0)),
            policy_version=rng.randrange(3),
        )
        for _ in range(rng.randrange(1, 13))
    ]


async def snapshot(store: BufferStore) -> dict[str, Any]:
    counters = await store.counters(NOW)
    found = await candidates(store)
    ids = [c.trajectory_id for trajectories in found.values() for c in trajectories]
    stored = await store.get_trajectories(sorted(ids))
    return {
        "counters": (
            counters.trajectories,
            counters.prompts_with_trajectories,
            round(counters.reward_sum, 9),
            counters.reward_histogram_counts,
            counters.per_version,
            counters.trajectories_added_total,
            counters.evicted_total,
        ),
        "candidates": found,
        "completions": [(t.id, t.completion_token_ids) for t in stored],
        "recent": await recent_prompt_ids(store, len(PROMPTS)),
        "by rank": await by_rank(store, UNIFORMS, len(PROMPTS)),
    }


async def add(store: BufferStore, batch: list[Trajectory], request_id: str) -> object:
    digest = codec.request_digest("s1", "", batch)
    return await store.add_trajectories(
        batch, request_id=request_id, searcher_id="s1", lease_id="", now_s=NOW, digest=digest
    )


@pytest.mark.parametrize("dedup", [True, False])
@pytest.mark.parametrize("seed", range(4))
def test_memory_and_redis_stores_agree_after_every_mixed_batch(
    shared_redis: Any, dedup: bool, seed: int
) -> None:
    limits = StoreLimits(
        capacity=10,
        prompt_history=3,
        dedup=dedup,
        request_id_ttl_s=60.0,
        reward_histogram_edges=(0.0, 0.5, 1.0),
    )

    async def main() -> None:
        memory = open_buffer_store("memory", "unused", limits)
        redis_store = open_buffer_store(shared_redis.url, uuid.uuid4().hex, limits)
        rng = random.Random(seed)
        try:
            for store in (memory, redis_store):
                await store.put_prompts([Prompt(p, f"question {p}") for p in PROMPTS])
            for step in range(40):
                batch, request_id = random_batch(rng), uuid.uuid4().hex
                results = [await add(s, batch, request_id) for s in (memory, redis_store)]
                assert results[0] == results[1], f"step {step}"
                assert await snapshot(memory) == await snapshot(redis_store), f"step {step}"
        finally:
            await memory.close()
            await redis_store.close()

    asyncio.run(main())
