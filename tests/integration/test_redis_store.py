"""What only the Redis store has to show: it computes exactly what MemoryStore computes,
keeps everything across a restart or a crash of redis-server (AOF), keeps to its key prefix,
and turns an unreachable Redis into UnavailableError, then recovers by itself."""

from __future__ import annotations

import asyncio
import collections
import random
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from tba.buffer.config import BufferSettings
from tba.buffer.memory_store import MemoryStore
from tba.buffer.redis_store import RedisStore
from tba.buffer.service import BufferService
from tba.buffer.store import BufferStore, PromptDraw, StoreLimits
from tba.domain import AddResult, Prompt, WeightVersion
from tba.errors import FailedPreconditionError, TbaError, UnavailableError
from tests.fixtures.data import trajectory
from tests.fixtures.redis_server import RedisServer
from tests.fixtures.store_reads import by_rank, candidates, recent_prompt_ids

NOW = 1_700_000_000.0
LIMITS = StoreLimits(
    capacity=40,
    prompt_history=5,
    dedup=True,
    request_id_ttl_s=30.0,
    reward_histogram_edges=(-1.0, 0.0, 0.5, 1.0),
)


def random_call(
    rng: random.Random, now: float, lease_ids: list[str]
) -> tuple[str, tuple, dict[str, Any]]:
    """One store call (name, arguments, keyword arguments) with arguments drawn to hit every
    path: id collisions, duplicate completions, replays, stale and unknown leases, evictions."""
    prompt_ids = [f"q{i}" for i in range(12)] + ["p1", "p3"]
    kind = rng.choice(["put", "lease", "add", "add", "add", "read", "counters", "announce"])
    if kind == "announce":  # moves the version a draw's age cut counts back from
        version = rng.randint(0, 4)
        return "announce_weights", (WeightVersion(version, "file:///w", "a" * 64, 0, now),), {}
    if kind == "put":
        ids = [rng.choice([*prompt_ids, "", ""]) for _ in range(rng.randint(1, 4))]
        return "put_prompts", ([Prompt(i, f"text {i}") for i in ids],), {}
    if kind == "lease":
        searcher = rng.choice(["s1", "s2"])
        max_prompts, lease_s = rng.randint(1, 5), rng.choice([1.0, 5.0, 50.0])
        return "lease_prompts", (searcher, max_prompts), {"lease_s": lease_s, "now_s": now}
    if kind == "add":
        trajs = [
            trajectory(
                rng.choice(prompt_ids),
                (rng.randint(0, 6), rng.randint(0, 2)),
                reward=rng.choice([-2.0, -0.3, 0.0, 0.1, 0.5, 0.7, 1.0, 3.5]),
                policy_version=rng.randint(0, 3),
            )
            for _ in range(rng.randint(1, 6))
        ]
        lease = rng.choice([*lease_ids[-3:], "", "l999"])
        request, digest = f"r{rng.randint(0, 30)}", rng.choice(["d0", "d1"])
        searcher = rng.choice(["s1", "s2"])
        return (
            "add_trajectories",
            (trajs,),
            dict(
                request_id=request, searcher_id=searcher, lease_id=lease, now_s=now, digest=digest
            ),
        )
    if kind == "read":
        if rng.random() < 0.5:
            return "draw_prompts", (random_draw(rng, prompt_ids),), {}
        if rng.random() < 0.5:
            return "get_trajectories", ([rng.randint(1, 200) for _ in range(6)],), {}
        groups = [[rng.randint(1, 200) for _ in range(rng.randint(0, 4))] for _ in range(3)]
        return "read_sampled", (groups,), {}
    return "counters", (now,), {}


def random_draw(rng: random.Random, prompt_ids: list[str]) -> PromptDraw:
    groups = rng.randint(0, 6)
    return PromptDraw(
        rng.randint(0, 8),
        rng.randint(0, groups),
        tuple(rng.random() for _ in range(groups)),
        tuple(rng.random() for _ in range(rng.randint(0, 10))),
        frozenset(rng.sample(prompt_ids, rng.randint(0, 3))),
        recent_candidates=rng.randint(0, 4),
        max_age_versions=rng.choice([None, 0, 1, 3]),
        min_version=rng.choice([None, None, 0, 2]),
    )


async def outcome(call: Awaitable[Any]) -> Any:
    """What a store call returned, or the domain error it raised as (type, message)."""
    try:
        return await call
    except TbaError as exc:
        return type(exc), str(exc)


# Without a freeze, and with growth frozen early (at step 25 the buffer holds fewer than its
# capacity of 40).
@pytest.mark.parametrize("freeze_at_step", [None, 25])
def test_redis_store_computes_exactly_what_memory_store_does(
    shared_redis: RedisServer, unique_prefix: str, freeze_at_step: int | None
) -> None:
    async def main() -> None:
        rng = random.Random(1234)
        memory = MemoryStore(LIMITS)
        redis_store = RedisStore(shared_redis.url, unique_prefix, LIMITS)
        now, lease_ids, paths = NOW, [], collections.Counter[str]()
        cap = LIMITS.capacity
        try:
            await memory.put_prompts([Prompt(f"q{i}", "x") for i in range(12)])
            await redis_store.put_prompts([Prompt(f"q{i}", "x") for i in range(12)])
            for step in range(600):
                if step == freeze_at_step:
                    cap = await memory.freeze_growth()
                    assert await redis_store.freeze_growth() == cap < LIMITS.capacity
                now += rng.choice([0.0, 0.001, 0.5, 2.0, 20.0])
                method, args, kwargs = random_call(rng, now, lease_ids)
                if method == "add_trajectories":  # the service only sends known prompts
                    known = await memory.get_prompts([t.prompt_id for t in args[0]])
                    args = ([t for t in args[0] if t.prompt_id in known],)
                    if not args[0]:
                        continue
                expected = await outcome(getattr(memory, method)(*args, **kwargs))
                got = await outcome(getattr(redis_store, method)(*args, **kwargs))
                assert got == expected, f"step {step}: {method}{args}{kwargs}"
                if method == "lease_prompts" and got.lease_id:
                    lease_ids.append(got.lease_id)
                if method == "add_trajectories":
                    refused = isinstance(got, tuple)
                    paths.update(refused=refused)
                    if not refused:
                        paths.update(replayed=got.replayed, replaced=got.replaced_duplicates > 0)
            counters = await redis_store.counters(now)
            assert counters.evicted_total > 0 and counters.trajectories == cap
            assert paths["replayed"] > 0 and paths["replaced"] > 0 and len(lease_ids) > 10
            assert paths["refused"] > 0
        finally:
            await redis_store.close()

    asyncio.run(main())


async def snapshot(store: BufferStore, now: float) -> dict[str, Any]:
    counters = await store.counters(now)
    prompt_ids = [f"q{i}" for i in range(6)]
    found = await candidates(store)
    ids = [c.trajectory_id for cs in found.values() for c in cs]
    return {
        "counters": counters,
        "prompts": await store.get_prompts(prompt_ids),
        "candidates": found,
        "trajectories": await store.get_trajectories(ids),
        "recent": await recent_prompt_ids(store, 10),
        "by rank": await by_rank(store, [0.1, 0.5, 0.9], 3),
        "weights": await store.latest_weights(),
    }


async def fill(store: BufferStore) -> str:
    """Prompts, trajectories, a lease in flight and weights; returns the lease id."""
    await store.put_prompts([Prompt(f"q{i}", f"question {i}", str(i)) for i in range(6)])
    lease = await store.lease_prompts("s1", 2, lease_s=100.0, now_s=NOW)
    for i in range(5):
        trajs = [
            trajectory(f"q{(i + j) % 6}", (i, j), reward=j / 3, policy_version=i) for j in range(4)
        ]
        await store.add_trajectories(
            trajs,
            request_id=f"r{i}",
            searcher_id="s1",
            lease_id="",
            now_s=NOW + i,
            digest=f"d{i}",
        )
    await store.read_sampled([[1, 2], [3], [999]])
    await store.announce_weights(WeightVersion(4, "file:///w/4", "c" * 64, 8, NOW))
    return lease.lease_id


@pytest.mark.parametrize("how", ["restart", "kill -9"])
def test_everything_comes_back_from_the_aof(redis_server: RedisServer, how: str) -> None:
    async def main() -> None:
        store = RedisStore(redis_server.url, "tba", LIMITS)
        try:
            lease_id = await fill(store)
            frozen_capacity = await store.freeze_growth()
            before = await snapshot(store, NOW + 10)
            # In a thread, as in a running service: the loop sees the old sockets close.
            if how == "restart":
                await asyncio.to_thread(redis_server.restart)
            else:
                await asyncio.to_thread(redis_server.kill)
                await asyncio.to_thread(redis_server.start)
            # The same store, on new connections; Redis has forgotten every script.
            assert await snapshot(store, NOW + 10) == before
            assert before["counters"].leases_in_flight == 2
            # The frozen cap too: the first one stays.
            assert await store.freeze_growth() == frozen_capacity == 20
            assert (await store.lease_prompts("s2", 6, lease_s=1.0, now_s=NOW + 10)).prompts[
                0
            ].id == "q2"
            result = await store.add_trajectories(
                [],
                request_id="r0",
                searcher_id="s1",
                lease_id=lease_id,
                now_s=NOW + 11,
                digest="d0",
            )
            assert result.replayed  # request ids survive as well, with their digests
            with pytest.raises(FailedPreconditionError):
                await store.add_trajectories(
                    [],
                    request_id="r1",
                    searcher_id="s1",
                    lease_id="",
                    now_s=NOW + 11,
                    digest="d0",
                )
        finally:
            await store.close()

    asyncio.run(main())


def test_stores_keep_to_their_key_prefix(redis_server: RedisServer) -> None:
    async def main() -> None:
        first = RedisStore(redis_server.url, "run-a", LIMITS)
        second = RedisStore(redis_server.url, "run-a2", LIMITS)
        try:
            await fill(first)
            assert (await second.counters(NOW)).prompts == 0
            assert await second.latest_weights() is None
            assert await recent_prompt_ids(second, 10) == []
            await second.put_prompts([Prompt("", "other")])
            assert (await first.counters(NOW)).prompts == 6
            assert (await first.get_prompts(["p1"])) == {}
        finally:
            await first.close()
            await second.close()

    asyncio.run(main())
    keys = redis_server.command("KEYS", "*")  # this server holds nothing else
    assert isinstance(keys, list) and keys
    assert all(k.startswith((b"run-a:", b"run-a2:")) for k in keys)


def test_keys_do_not_grow_with_the_number_of_trajectories(
    shared_redis: RedisServer, unique_prefix: str
) -> None:
    def key_count() -> int:
        keys = shared_redis.command("KEYS", f"{unique_prefix}:*")
        assert isinstance(keys, list)
        return len(keys)

    async def add_batches(store: BufferStore, batches: range) -> None:
        for b in batches:
            trajs = [trajectory(f"q{i % 6}", (b, i), reward=0.5) for i in range(50)]
            await store.add_trajectories(
                trajs,
                request_id=f"r{b}",
                searcher_id="s1",
                lease_id="",
                now_s=NOW,
                digest=f"d{b}",
            )

    async def main() -> tuple[int, int]:
        limits = StoreLimits(10_000, 1000, True, 60.0, (0.0, 1.0))
        store = RedisStore(shared_redis.url, unique_prefix, limits)
        try:
            await store.put_prompts([Prompt(f"q{i}", "x") for i in range(6)])
            await add_batches(store, range(2))
            few = key_count()
            await add_batches(store, range(2, 40))
            assert (await store.counters(NOW)).trajectories == 2000
            return few, key_count()
        finally:
            await store.close()

    few, many = asyncio.run(main())
    assert few == many  # 100 and 2,000 trajectories: the same keys
    assert many <= 20 + 2 * 6  # global keys, then a history and a digest index per prompt


def test_unreachable_redis_raises_unavailable_then_recovers(redis_server: RedisServer) -> None:
    calls: list[Callable[[BufferStore], Awaitable[object]]] = [
        lambda s: s.put_prompts([Prompt("", "while down")]),  # a script
        lambda s: s.get_prompts(["q1"]),  # a plain command
        lambda s: s.counters(NOW),  # a transaction
        lambda s: s.get_trajectories([1]),
    ]

    async def main() -> None:
        store = RedisStore(redis_server.url, "tba", LIMITS, timeout_s=2.0)
        try:
            await fill(store)
            await asyncio.to_thread(redis_server.kill)
            for call in calls:
                with pytest.raises(UnavailableError, match="cannot be reached"):
                    await call(store)
            await asyncio.to_thread(redis_server.start)
            assert (await store.counters(NOW)).prompts == 6
            created = await store.put_prompts([Prompt("", "after")])
            assert created.created == 1
        finally:
            await store.close()

    asyncio.run(main())


def test_scripts_are_loaded_again_after_redis_forgets_them(
    shared_redis: RedisServer, unique_prefix: str
) -> None:
    async def main() -> None:
        store = RedisStore(shared_redis.url, unique_prefix, LIMITS)
        try:
            await store.put_prompts([Prompt("a", "x")])
            assert shared_redis.command("SCRIPT", "FLUSH") == "OK"
            assert (await store.put_prompts([Prompt("", "y")])).prompt_ids == ["p1"]
        finally:
            await store.close()

    asyncio.run(main())


def test_a_request_id_kept_before_digests_still_replays(
    shared_redis: RedisServer, unique_prefix: str
) -> None:
    """An id an older buffer stored ("accepted replaced evicted", no digest) in the same
    Redis: a retry after the upgrade gets its first result, whatever the digest."""
    expires_ms = int((NOW + 30) * 1000)
    shared_redis.command("HSET", f"{unique_prefix}:req", "old", "2 1 0")
    shared_redis.command("ZADD", f"{unique_prefix}:req_exp", expires_ms, "old")

    async def main() -> None:
        store = RedisStore(shared_redis.url, unique_prefix, LIMITS)
        try:
            await store.put_prompts([Prompt("q1", "x")])
            again = await store.add_trajectories(
                [trajectory("q1")],
                request_id="old",
                searcher_id="s1",
                lease_id="",
                now_s=NOW,
                digest="d",
            )
            assert again == AddResult(2, 1, 0, replayed=True)
            assert (await store.counters(NOW)).trajectories == 0
        finally:
            await store.close()

    asyncio.run(main())


def test_a_chunked_add_stores_once_in_redis_and_its_retry_replays(
    shared_redis: RedisServer, unique_prefix: str
) -> None:
    """The service's chunks (`[buffer] add_chunk_size`) go to Redis under ids with a space
    after the caller's; each is kept for retries like any request id."""

    async def main() -> None:
        store = RedisStore(shared_redis.url, unique_prefix, LIMITS)
        service = BufferService(store, BufferSettings(add_chunk_size=2))
        try:
            await service.put_prompts([Prompt("q1", "x")])
            batch = [trajectory("q1", (c,)) for c in range(5)]
            first = await service.add_trajectories(
                batch, request_id="r", searcher_id="s1", lease_id=""
            )
            again = await service.add_trajectories(
                batch, request_id="r", searcher_id="s1", lease_id=""
            )
            assert (first.accepted, first.replayed) == (5, False)
            assert (again.accepted, again.replayed) == (5, True)
            assert (await store.counters(NOW)).trajectories == 5
            kept = shared_redis.command("HKEYS", f"{unique_prefix}:req")
            assert sorted(kept) == [b"r 0+2", b"r 2+2", b"r 4+1"]
        finally:
            await store.close()

    asyncio.run(main())
