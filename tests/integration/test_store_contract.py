"""The BufferStore contract, run against both stores: the embedded MemoryStore and a
RedisStore on a real redis-server. Every point of the contract has a test here."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import Awaitable, Callable

import numpy as np
import pytest

from tba.buffer import codec, sampling
from tba.buffer.history import BufferPoint, Evaluation, HistoryPoint
from tba.buffer.store import (
    BufferStore,
    Candidate,
    DrawnPrompts,
    PromptDraw,
    StoreLimits,
    open_buffer_store,
)
from tba.domain import (
    AddResult,
    FinishReason,
    Lease,
    Prompt,
    SampleSource,
    TrainerReport,
    Trajectory,
    WeightVersion,
    pack_tokens,
)
from tba.errors import FailedPreconditionError, InvalidArgumentError
from tba.runs import Run, RunIdentity, RunRecipe
from tests.fixtures.data import trajectory, with_token_logprobs
from tests.fixtures.store_reads import by_rank, candidates, ids_of, recent_prompt_ids

NOW = 1_700_000_000.0
EDGES = (0.0, 0.5, 1.0)
MakeStore = Callable[[StoreLimits], BufferStore]
Scenario = Callable[[BufferStore], Awaitable[None]]


def limits(**changes: object) -> StoreLimits:
    base = StoreLimits(
        capacity=1000,
        prompt_history=100,
        dedup=True,
        request_id_ttl_s=60.0,
        reward_histogram_edges=EDGES,
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


@pytest.fixture(params=["memory", "redis"])
def make_store(request: pytest.FixtureRequest) -> MakeStore:
    if request.param == "memory":
        return lambda lim: open_buffer_store("memory", "unused", lim)
    url = request.getfixturevalue("shared_redis").url
    prefix = request.getfixturevalue("unique_prefix")
    return lambda lim: open_buffer_store(url, prefix, lim)


def run(make_store: MakeStore, scenario: Scenario, lim: StoreLimits | None = None) -> None:
    async def main() -> None:
        store = make_store(lim or limits())
        try:
            await scenario(store)
        finally:
            await store.close()

    asyncio.run(main())


async def put(store: BufferStore, *ids: str) -> None:
    await store.put_prompts([Prompt(i, f"question {i}") for i in ids])


async def add(
    store: BufferStore,
    *trajectories: Trajectory,
    lease_id: str = "",
    now: float = NOW,
    request_id: str = "",
    run_id: str = "",
) -> AddResult:
    request_id = request_id or uuid.uuid4().hex
    digest = codec.request_digest("s1", lease_id, trajectories)
    return await store.add_trajectories(
        trajectories,
        request_id=request_id,
        searcher_id="s1",
        lease_id=lease_id,
        now_s=now,
        digest=digest,
        run_id=run_id,
    )


def stored(sent: Trajectory, trajectory_id: int) -> Trajectory:
    """`sent` as a store keeps it when `add` sent it: under its id and the request's searcher."""
    return dataclasses.replace(sent, id=trajectory_id, searcher_id="s1")


async def leased(
    store: BufferStore, max_prompts: int, now: float, lease_s: float = 100.0
) -> tuple[str, list[str]]:
    lease = await store.lease_prompts("s1", max_prompts, lease_s=lease_s, now_s=now)
    return lease.lease_id, [p.id for p in lease.prompts]


def test_put_prompts_assigns_new_ids_and_keeps_existing_ones(make_store: MakeStore) -> None:
    async def scenario(store: BufferStore) -> None:
        first = await store.put_prompts([Prompt("", "a"), Prompt("q", "b"), Prompt("", "c")])
        assert (first.prompt_ids, first.created) == (["p1", "q", "p2"], 3)
        second = await store.put_prompts([Prompt("q", "changed"), Prompt("", "d")])
        assert (second.prompt_ids, second.created) == (["q", "p3"], 1)
        found = await store.get_prompts(["q", "p3", "unknown"])
        assert found == {"q": Prompt("q", "b"), "p3": Prompt("p3", "d")}
        await store.put_prompts([Prompt("p4", "taken by hand", "42")])
        third = await store.put_prompts([Prompt("", "e")])
        assert third.prompt_ids == ["p5"]
        assert (await store.get_prompts(["p4"]))["p4"].answer == "42"
        assert (await store.counters(NOW)).prompts == 6

    run(make_store, scenario)


def test_new_prompts_lease_first_and_expired_leases_come_back(make_store: MakeStore) -> None:
    async def scenario(store: BufferStore) -> None:
        await put(store, "c", "a", "b")
        lease = await store.lease_prompts("s1", 2, lease_s=10.0, now_s=NOW)
        assert [p.id for p in lease.prompts] == ["c", "a"]
        assert lease.lease_id and lease.expires_at_s == NOW + 10.0
        assert (await leased(store, 5, NOW, 10.0))[1] == ["b"]
        assert await store.lease_prompts("s1", 5, lease_s=10.0, now_s=NOW + 9.0) == Lease(
            "", [], 0.0
        )
        assert (await store.counters(NOW + 9.0)).leases_in_flight == 3
        await put(store, "d")
        # At expiry: the new prompt first, then the expired ones (same time: by id).
        assert (await leased(store, 10, NOW + 10.0))[1] == ["d", "a", "b", "c"]

    run(make_store, scenario)


def test_acknowledged_prompts_go_to_the_back_of_the_rotation(make_store: MakeStore) -> None:
    async def scenario(store: BufferStore) -> None:
        await put(store, "a", "b", "c")
        lease_a, _ = await leased(store, 1, NOW)
        lease_b, _ = await leased(store, 1, NOW)
        await add(store, trajectory("b"), lease_id=lease_b, now=NOW + 1)
        await add(store, trajectory("a"), lease_id=lease_a, now=NOW + 2)
        assert (await store.counters(NOW + 2)).leases_in_flight == 0
        assert (await leased(store, 3, NOW + 3))[1] == ["c", "b", "a"]
        assert (await store.counters(NOW + 3)).leases_in_flight == 3

    run(make_store, scenario)


def test_stale_or_unknown_lease_acks_store_trajectories_only(make_store: MakeStore) -> None:
    async def scenario(store: BufferStore) -> None:
        await put(store, "a", "b")
        first, _ = await leased(store, 1, NOW, lease_s=10.0)
        second, taken = await leased(store, 2, NOW + 20)
        assert taken == ["b", "a"]
        late = await add(store, trajectory("a", (1,)), lease_id=first, now=NOW + 21)
        unknown = await add(store, trajectory("a", (2,)), lease_id="l999", now=NOW + 21)
        assert late.accepted == unknown.accepted == 1
        assert len(await ids_of(store, "a")) == 2
        assert (await store.counters(NOW + 21)).leases_in_flight == 2
        assert (await leased(store, 5, NOW + 21))[1] == []
        await add(store, trajectory("b"), lease_id=second, now=NOW + 22)
        assert (await leased(store, 5, NOW + 22))[1] == ["a", "b"]

    run(make_store, scenario)


def test_leasing_records_the_searcher(make_store: MakeStore) -> None:
    async def scenario(store: BufferStore) -> None:
        await store.lease_prompts("idle", 1, lease_s=10.0, now_s=NOW)
        await put(store, "a")
        await store.lease_prompts("busy", 1, lease_s=10.0, now_s=NOW + 1)
        await store.add_trajectories(
            [trajectory("a")],
            request_id="r",
            searcher_id="busy",
            lease_id="",
            now_s=NOW + 2,
            digest="d",
        )
        searchers = (await store.counters(NOW + 2)).searchers
        assert [(s.searcher_id, s.last_seen_s, s.trajectories_added) for s in searchers] == [
            ("busy", NOW + 2, 1),
            ("idle", NOW, 0),
        ]

    run(make_store, scenario)


def test_trajectories_get_increasing_ids_and_round_trip_under_the_requests_searcher(
    make_store: MakeStore,
) -> None:
    async def scenario(store: BufferStore) -> None:
        await put(store, "a", "b")
        sent = [trajectory("a", (1,)), trajectory("b", (2,)), trajectory("a", (3,), 0.25, 2)]
        sent[2].searcher_id, sent[2].created_at_s = "s9", NOW - 5
        sent[2].finish_reason, sent[2].prompt_token_ids = FinishReason.LENGTH, pack_tokens([7])
        result = await add(store, *sent)
        assert result == AddResult(accepted=3, replaced_duplicates=0, evicted=0)
        assert await ids_of(store, "a") == [1, 3]
        assert await ids_of(store, "b") == [2]
        got = await store.get_trajectories([3, 1, 99, 2])
        assert [t.id for t in got] == [3, 1, 2]
        assert got[0] == stored(sent[2], 3)  # under "s1", not its own "s9"
        assert got[2] == stored(sent[1], 2)
        assert await add(store, trajectory("b", (4,))) == AddResult(1, 0, 0)
        assert await ids_of(store, "b") == [2, 4]

    run(make_store, scenario)


def test_read_sampled_reads_groups_in_order_and_counts_those_still_there(
    make_store: MakeStore,
) -> None:
    async def scenario(store: BufferStore) -> None:
        await put(store, "a", "b")
        sent = [trajectory("a", (1,)), trajectory("b", (2,)), trajectory("a", (3,), 0.5, 1)]
        await add(store, *sent)
        read = await store.read_sampled([[3, 1], [98, 99], [99, 2], []])
        assert [[t.id for t in group] for group in read] == [[3, 1], [], [2], []]
        assert read[0][0] == stored(sent[2], 3)
        assert (await store.counters(NOW)).groups_sampled_total == 2
        assert await store.read_sampled([]) == []
        assert (await store.counters(NOW)).groups_sampled_total == 2

    run(make_store, scenario)


def test_token_logprobs_round_trip_beside_trajectories_without_them(
    make_store: MakeStore,
) -> None:
    async def scenario(store: BufferStore) -> None:
        await put(store, "a")
        with_tokens = with_token_logprobs(trajectory("a", (5, 6)), [-0.5, -0.25], [-1.0, -2.5])
        sent = [with_tokens, trajectory("a", (7,))]
        assert await add(store, *sent) == AddResult(accepted=2, replaced_duplicates=0, evicted=0)
        got = await store.get_trajectories([1, 2])
        assert got == [stored(t, i) for i, t in enumerate(sent, 1)]
        assert got[1].behavior_token_logprobs == got[1].ref_token_logprobs == b""

    run(make_store, scenario)


def test_sampling_temperatures_round_trip_beside_trajectories_without_them(
    make_store: MakeStore,
) -> None:
    async def scenario(store: BufferStore) -> None:
        await put(store, "a")
        drawn = dataclasses.replace(trajectory("a", (5, 6)), sampling_temperature=1.37)
        ranged = with_token_logprobs(trajectory("a", (8,)), [-0.5], [-1.0])
        ranged.sampling_temperature = 0.71
        sent = [drawn, ranged, trajectory("a", (7,))]
        assert await add(store, *sent) == AddResult(accepted=3, replaced_duplicates=0, evicted=0)
        got = await store.get_trajectories([1, 2, 3])
        assert got == [stored(t, i) for i, t in enumerate(sent, 1)]
        assert [t.sampling_temperature for t in got] == [1.37, 0.71, 0.0]

    run(make_store, scenario)


def test_a_repeated_request_id_replays_the_first_result(make_store: MakeStore) -> None:
    async def scenario(store: BufferStore) -> None:
        await put(store, "a", "b")
        await add(store, trajectory("a", (9,)))
        batch = (trajectory("a", (9,)), trajectory("b"))
        first = await add(store, *batch, request_id="r1")
        before = await store.counters(NOW)
        again = await add(store, *batch, request_id="r1", now=NOW + 59)
        assert again == dataclasses.replace(first, replayed=True)
        assert first == AddResult(2, 1, 0)
        assert await store.counters(NOW) == before
        assert await ids_of(store, "b") == [3]
        after_ttl = await add(store, trajectory("b", (5,)), request_id="r1", now=NOW + 60)
        assert after_ttl == AddResult(1, 0, 0)
        assert await ids_of(store, "b") == [3, 4]

    run(make_store, scenario)


def test_a_request_id_reused_for_another_batch_is_refused(make_store: MakeStore) -> None:
    async def scenario(store: BufferStore) -> None:
        await put(store, "a", "b")
        first = await add(store, trajectory("a", (1,)), request_id="r1")
        before = await store.counters(NOW)
        with pytest.raises(FailedPreconditionError, match=r"'r1'.*different batch"):
            await add(store, trajectory("b", (5,)), request_id="r1", now=NOW + 1)
        assert await store.counters(NOW) == before
        assert await ids_of(store, "b") == []
        again = await add(store, trajectory("a", (1,)), request_id="r1", now=NOW + 2)
        assert again == dataclasses.replace(first, replayed=True)
        after_ttl = await add(store, trajectory("b", (5,)), request_id="r1", now=NOW + 60)
        assert after_ttl == AddResult(1, 0, 0)

    run(make_store, scenario)


def test_identical_completions_of_a_prompt_replace_each_other(make_store: MakeStore) -> None:
    async def scenario(store: BufferStore) -> None:
        await put(store, "a", "b")
        await add(store, trajectory("a", (1, 2), reward=0.0))
        result = await add(store, trajectory("a", (1, 2), reward=1.0), trajectory("b", (1, 2)))
        assert result == AddResult(2, 1, 0)
        assert (await candidates(store))["a"] == [Candidate(2, 1.0, 0)]
        assert await ids_of(store, "b") == [3]
        within = await add(store, trajectory("a", (5,)), trajectory("a", (5,), policy_version=4))
        assert within == AddResult(2, 1, 0)
        assert (await candidates(store))["a"] == [Candidate(2, 1.0, 0), Candidate(5, 1.0, 4)]
        counters = await store.counters(NOW)
        assert (counters.trajectories, counters.per_version) == (3, {0: 2, 4: 1})
        assert counters.trajectories_added_total == 5 and counters.evicted_total == 0

    run(make_store, scenario)


def test_without_dedup_identical_completions_are_kept(make_store: MakeStore) -> None:
    async def scenario(store: BufferStore) -> None:
        await put(store, "a")
        result = await add(store, trajectory("a", (1,)), trajectory("a", (1,)))
        assert result == AddResult(2, 0, 0)
        assert await ids_of(store, "a") == [1, 2]

    run(make_store, scenario, limits(dedup=False))


def test_per_prompt_history_evicts_that_prompts_oldest(make_store: MakeStore) -> None:
    async def scenario(store: BufferStore) -> None:
        await put(store, "a", "b")
        await add(store, trajectory("a", (1,)), trajectory("a", (2,)), trajectory("b", (1,)))
        result = await add(store, trajectory("a", (3,)), trajectory("a", (4,)))
        assert result == AddResult(2, 0, 2)
        assert await ids_of(store, "a") == [4, 5]
        assert await ids_of(store, "b") == [3]
        assert await store.get_trajectories([1, 2]) == []
        assert (await store.counters(NOW)).evicted_total == 2

    run(make_store, scenario, limits(prompt_history=2))


def test_capacity_evicts_the_globally_oldest(make_store: MakeStore) -> None:
    async def scenario(store: BufferStore) -> None:
        await put(store, "a", "b", "c", "d")
        await add(store, trajectory("a", reward=0.9, policy_version=1), trajectory("b", reward=0.1))
        await add(store, trajectory("c", reward=0.2))
        result = await add(store, trajectory("d", reward=0.3), trajectory("b", (7,), 0.4))
        assert result == AddResult(2, 0, 2)
        found = await candidates(store)
        assert "a" not in found and found["b"] == [Candidate(5, 0.4, 0)]
        assert await recent_prompt_ids(store, 10) == ["b", "d", "c"]
        assert await by_rank(store, [0.0, 0.5, 0.9], 3) == ["b", "c", "d"]
        counters = await store.counters(NOW)
        assert counters.trajectories == 3 and counters.prompts_with_trajectories == 3
        assert counters.per_version == {0: 3} and counters.evicted_total == 2
        assert counters.reward_histogram_counts == [3, 0]
        assert counters.reward_sum == pytest.approx(0.9)
        await add(store, trajectory("a", reward=1.0))  # a prompt that emptied comes back
        assert (await recent_prompt_ids(store, 1)) == ["a"]
        assert (await candidates(store))["a"] == [Candidate(6, 1.0, 0)]

    run(make_store, scenario, limits(capacity=3))


def test_frozen_growth_holds_what_was_held_and_evicts_the_oldest(make_store: MakeStore) -> None:
    async def scenario(store: BufferStore) -> None:
        await put(store, "a", "b", "c")
        await add(store, trajectory("a", (1,)), trajectory("b", (1,)), trajectory("c", (1,)))
        assert await store.freeze_growth() == 3
        # Accepted as before; each one beyond the cap evicts the globally oldest.
        result = await add(store, trajectory("a", (2,)), trajectory("c", (2,)))
        assert result == AddResult(2, 0, 2)
        assert await candidates(store) == {
            "a": [Candidate(4, 1.0, 0)],
            "c": [Candidate(3, 1.0, 0), Candidate(5, 1.0, 0)],
        }
        # A duplicate replaces its twin in place; every new one evicts the oldest.
        assert await add(store, trajectory("c", (2,))) == AddResult(1, 1, 0)
        await add(store, trajectory("b", (7,)), trajectory("b", (8,)))
        counters = await store.counters(NOW)
        assert counters.trajectories == 3 and counters.evicted_total == 4
        assert await store.freeze_growth() == 3  # the first cap stays
        assert await ids_of(store, "b") == [7, 8]

    run(make_store, scenario, limits(capacity=10))


def test_growth_frozen_empty_keeps_the_newest(make_store: MakeStore) -> None:
    async def scenario(store: BufferStore) -> None:
        await put(store, "a")
        assert await store.freeze_growth() == 1
        await add(store, trajectory("a", (1,)), trajectory("a", (2,)))
        assert await ids_of(store, "a") == [2]

    run(make_store, scenario)


def test_growth_frozen_full_keeps_the_capacity(make_store: MakeStore) -> None:
    async def scenario(store: BufferStore) -> None:
        await put(store, "a")
        await add(store, *(trajectory("a", (i,)) for i in range(3)))
        assert await store.freeze_growth() == 2
        assert await add(store, trajectory("a", (9,))) == AddResult(1, 0, 1)

    run(make_store, scenario, limits(capacity=2))


def test_recent_prompts_are_ordered_by_newest_trajectory(make_store: MakeStore) -> None:
    async def scenario(store: BufferStore) -> None:
        assert await recent_prompt_ids(store, 5) == []
        await put(store, "a", "b", "c")
        await add(store, trajectory("a", (1,)), trajectory("b", (1,)), trajectory("c", (1,)))
        await add(store, trajectory("a", (2,)))
        assert await recent_prompt_ids(store, 10) == ["a", "c", "b"]
        assert await recent_prompt_ids(store, 2) == ["a", "c"]

    run(make_store, scenario)


def test_recency_puts_the_newest_policy_version_first(make_store: MakeStore) -> None:
    async def scenario(store: BufferStore) -> None:
        await put(store, "a", "b", "c", "d")
        await add(store, trajectory("a", (1,), policy_version=2), trajectory("b", (1,)))
        # Older versions, added later (a searcher that leased before the last publish), stay
        # behind; among equal versions the newest add comes first.
        await add(store, trajectory("c", (1,), policy_version=1), trajectory("d", (1,)))
        assert await recent_prompt_ids(store, 10) == ["a", "c", "d", "b"]
        # A prompt moves up only: an older version's completion leaves it where it was.
        await add(
            store, trajectory("a", (2,), policy_version=0), trajectory("b", (2,), policy_version=3)
        )
        assert await recent_prompt_ids(store, 10) == ["b", "a", "c", "d"]

    run(make_store, scenario)


def test_a_prompt_whose_completions_all_went_takes_its_new_place(make_store: MakeStore) -> None:
    async def scenario(store: BufferStore) -> None:
        await put(store, "a", "b")
        await add(store, trajectory("a", (1,), policy_version=5), trajectory("b", (1,), 0.0, 1))
        assert await recent_prompt_ids(store, 10) == ["a", "b"]
        # The same completion at version 0 replaces a's only one (de-duplication).
        assert await add(store, trajectory("a", (1,), policy_version=0)) == AddResult(1, 1, 0)
        assert await ids_of(store, "a") == [3]
        assert await recent_prompt_ids(store, 10) == ["b", "a"]

    run(make_store, scenario)


def test_reward_prompts_are_chosen_by_rank_without_repeats(make_store: MakeStore) -> None:
    async def scenario(store: BufferStore) -> None:
        await put(store, "b", "a", "c", "z")
        assert await by_rank(store, [0.5], 1) == []
        await add(store, trajectory("b"), trajectory("a"), trajectory("c"))
        uniforms = [0.34, 0.5, 0.9999, 0.67, 0.0]
        assert await by_rank(store, uniforms, 3) == ["b", "c", "a"]
        assert await by_rank(store, uniforms, 2) == ["b", "c"]
        assert await by_rank(store, [], 2) == []

    run(make_store, scenario)


def test_candidates_list_each_prompts_trajectories_oldest_first(make_store: MakeStore) -> None:
    async def scenario(store: BufferStore) -> None:
        await put(store, "a", "b", "c")
        await add(store, trajectory("a", (1,), -0.5, 3), trajectory("b", (1,), 2.0, 1))
        await add(store, trajectory("a", (2,), 0.125, 4))
        assert await candidates(store) == {
            "a": [Candidate(1, -0.5, 3), Candidate(3, 0.125, 4)],
            "b": [Candidate(2, 2.0, 1)],
        }

    run(make_store, scenario)


def test_a_draw_chooses_as_the_sampling_maths_do_and_reads_what_it_chose(
    make_store: MakeStore,
) -> None:
    async def scenario(store: BufferStore) -> None:
        await put(store, "a", "b", "c", "d", "e", "f")
        await add(store, *(trajectory(p, (1,), reward=0.5) for p in "abcde"))
        await add(store, trajectory("b", (2,), policy_version=3))
        await store.announce_weights(WeightVersion(7, "file:///w/7", "a" * 64, 70, NOW))
        window, ranked = ["b", "e", "d"], ["a", "b", "c", "d", "e"]  # "f" has no trajectory
        rng = np.random.default_rng(3)
        for _ in range(30):
            groups = int(rng.integers(0, 5))
            draw = PromptDraw(
                len(window),
                int(rng.integers(0, groups + 1)),
                tuple(rng.random(groups).tolist()),
                tuple(rng.random(int(rng.integers(0, 8))).tolist()),
                frozenset(rng.choice(ranked, int(rng.integers(0, 3))).tolist()),
            )
            drawn = await store.draw_prompts(draw)
            expected = sampling.choose_prompts(window, ranked, draw)
            assert list(drawn.sources.items()) == list(expected.items())
            assert drawn.prompts == {p: Prompt(p, f"question {p}") for p in expected}
            assert drawn.candidates == {p: (await candidates(store))[p] for p in expected}
            assert drawn.latest_version == 7

    run(make_store, scenario)


def test_a_draw_reads_only_the_candidates_its_prompts_can_give(make_store: MakeStore) -> None:
    async def scenario(store: BufferStore) -> None:
        await put(store, "a", "b")
        # "a" has versions 3, 4, 4, 5 and then a version 2 posted late; "b" 4 and 5
        await add(store, *(trajectory("a", (i,), 0.5, v) for i, v in enumerate((3, 4, 4, 5, 2))))
        await add(store, trajectory("b", (1,), 1.0, 4), trajectory("b", (2,), 0.0, 5))
        await store.announce_weights(WeightVersion(5, "file:///w/5", "a" * 64, 50, NOW))
        every = await candidates(store)

        async def read(max_age: int | None, min_version: int | None) -> dict[str, list[Candidate]]:
            # the window's first ("b", newest id) by recency, the first by rank ("a") by reward
            draw = PromptDraw(2, 1, (0.0, 0.0), (0.0,), frozenset(), 1, max_age, min_version)
            drawn = await store.draw_prompts(draw)
            assert drawn.sources == {"b": SampleSource.RECENCY, "a": SampleSource.REWARD}
            return drawn.candidates

        # max age 1 behind version 5: from version 4; "b" by recency: its newest one only
        assert await read(1, None) == {"a": every["a"][1:4], "b": every["b"][1:]}
        assert await read(None, 5) == {"a": every["a"][3:4], "b": every["b"][1:]}  # fixed
        assert await read(None, None) == {"a": every["a"], "b": every["b"][1:]}

    run(make_store, scenario)


def test_a_draw_before_any_weights_reports_version_0(make_store: MakeStore) -> None:
    async def scenario(store: BufferStore) -> None:
        drawn = await store.draw_prompts(PromptDraw(4, 1, (0.5, 0.5), (0.5,) * 4, frozenset()))
        assert drawn == DrawnPrompts(0, {}, {}, {})

    run(make_store, scenario)


def test_counters_aggregate_what_is_stored(make_store: MakeStore) -> None:
    async def scenario(store: BufferStore) -> None:
        await put(store, "a", "b")
        await store.lease_prompts("s1", 1, lease_s=5.0, now_s=NOW)
        await add(store, *(trajectory("a", (i,), r, i % 2) for i, r in enumerate(REWARDS)))
        await store.read_sampled([[1], [2, 3], [4]])
        await store.read_sampled([[5], [6], [1, 99], [99], [2]])
        counters = await store.counters(NOW)
        assert counters.trajectories == len(REWARDS) and counters.prompts == 2
        assert counters.prompts_with_trajectories == 1
        assert counters.leases_in_flight == 1
        assert (await store.counters(NOW + 5)).leases_in_flight == 0
        # bins of (0, 0.5, 1): below and into the first, the second, above into the last
        assert counters.reward_histogram_counts == [3, 3]
        assert counters.reward_sum == pytest.approx(sum(REWARDS))
        assert counters.per_version == {0: 3, 1: 3}
        assert counters.groups_sampled_total == 7  # 3 + 4: [99] is no group
        assert counters.trajectories_added_total == 6 and counters.evicted_total == 0

    run(make_store, scenario)


REWARDS = (-3.0, 0.0, 0.49, 0.5, 1.0, 8.0)


def test_weight_versions_only_move_forward(make_store: MakeStore) -> None:
    async def scenario(store: BufferStore) -> None:
        assert await store.latest_weights() is None
        first = WeightVersion(1, "file:///w/1", "a" * 64, 2, NOW + 0.25)
        await store.announce_weights(first)
        assert await store.latest_weights() == first
        for stale in (1, 0):
            with pytest.raises(FailedPreconditionError):
                await store.announce_weights(dataclasses.replace(first, version=stale))
        third = WeightVersion(3, "s3://b/w/3", "b" * 64, 6, NOW + 9)
        await store.announce_weights(third)
        assert await store.latest_weights() == third

    run(make_store, scenario)


def test_open_buffer_store_knows_memory_and_redis_urls_only() -> None:
    with pytest.raises(InvalidArgumentError, match="unknown store"):
        open_buffer_store("postgres://db", "tba", limits())


def a_run(run_id: str, task_name: str = "arithmetic") -> Run:
    identity = RunIdentity("tiny", "sha256:" + "a" * 64, "b" * 64, task_name, "c" * 64, 1.0, 5)
    return Run(run_id, identity, RunRecipe('{"name": "arithmetic"}', '{"source": "tiny"}', 3), NOW)


def test_the_first_run_registered_stays(make_store: MakeStore) -> None:
    async def scenario(store: BufferStore) -> None:
        assert await store.current_run() is None
        first = a_run("r1")
        assert await store.register_run(first) == first
        assert await store.register_run(a_run("r2", "gsm8k")) == first
        assert await store.current_run() == first

    run(make_store, scenario)


def test_untagged_trajectories_only_while_no_run_is_registered(make_store: MakeStore) -> None:
    async def scenario(store: BufferStore) -> None:
        await put(store, "a")
        assert (await add(store, trajectory("a", (1,)))).accepted == 1
        with pytest.raises(FailedPreconditionError, match="no run registered"):
            await add(store, trajectory("a", (2,)), run_id="r1")
        await store.register_run(a_run("r1"))
        with pytest.raises(FailedPreconditionError, match=r"untagged.*serves run r1"):
            await add(store, trajectory("a", (3,)))
        with pytest.raises(FailedPreconditionError, match=r"run r2.*serves run r1"):
            await add(store, trajectory("a", (4,)), run_id="r2")
        assert (await add(store, trajectory("a", (5,)), run_id="r1")).accepted == 1
        counters = await store.counters(NOW)
        assert counters.trajectories == 2 and counters.trajectories_added_total == 2

    run(make_store, scenario)


def test_concurrent_registrations_agree_on_one_run(make_store: MakeStore) -> None:
    async def scenario(store: BufferStore) -> None:
        contenders = [a_run(f"r{i}") for i in range(8)]
        registered = await asyncio.gather(*(store.register_run(r) for r in contenders))
        assert len(set(registered)) == 1 and registered[0] in contenders
        assert await store.current_run() == registered[0]

    run(make_store, scenario)


def a_point(at_s: float, version: int = 0) -> HistoryPoint:
    state = BufferPoint(0.25, 3.5, 1.0, 0.5, 2, 10, 40, 2, version)
    report = TrainerReport(7, 1.5, 0.01, -2.0, 1e-4, 0.75, 0.2, 0.05)
    return HistoryPoint(at_s, buffer=state, trainer=report if version % 2 else None)


def test_history_keeps_the_points_after_since_oldest_first(make_store: MakeStore) -> None:
    async def scenario(store: BufferStore) -> None:
        assert await store.history(0.0) == []
        evaluation = HistoryPoint(NOW + 7, evaluation=Evaluation(3, 6, {"accuracy": 0.625}))
        points = [a_point(NOW, 1), a_point(NOW + 5, 2), evaluation, a_point(NOW + 10, 3)]
        for point in (points[1], points[0], points[3], points[2]):
            await store.append_history(point)
        await store.append_history(points[0])  # the same point again is kept once
        assert await store.history(0.0) == points
        assert await store.history(NOW) == points[1:]
        assert await store.history(NOW + 7.5) == points[3:]
        assert await store.history(NOW + 10) == []

    run(make_store, scenario)


def test_history_forgets_points_beyond_its_span_and_count(make_store: MakeStore) -> None:
    async def scenario(store: BufferStore) -> None:
        for at_s in (NOW, NOW + 10, NOW + 25):
            await store.append_history(a_point(at_s))
        # NOW is at or before NOW + 25 - 20: forgotten.
        assert [p.at_s for p in await store.history(0.0)] == [NOW + 10, NOW + 25]
        for at_s in (NOW + 26, NOW + 27):
            await store.append_history(a_point(at_s))
        assert [p.at_s for p in await store.history(0.0)] == [NOW + 25, NOW + 26, NOW + 27]

    run(make_store, scenario, limits(history_span_s=20.0, history_max_points=3))
