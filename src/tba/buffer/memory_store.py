"""The embedded store: the whole buffer in this process's memory, for one-machine runs.

It implements the same contract as `RedisStore`, step for step like its Lua scripts (one
contract suite checks both). No method awaits, so on one asyncio loop every call is atomic.
Ordered indexes (the lease pool by time, prompts by rank) are SortedLists: O(log N) updates.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from sortedcontainers import SortedList

from tba.buffer import codec, history, sampling
from tba.buffer.store import (
    Candidate,
    DrawnPrompts,
    PromptDraw,
    StoreCounters,
    StoreLimits,
    reused_request_id,
)
from tba.domain import (
    AddResult,
    Lease,
    Prompt,
    PutPromptsResult,
    SearcherInfo,
    Trajectory,
    WeightVersion,
)
from tba.errors import FailedPreconditionError
from tba.runs import Run, check_tagged


class _Pool:
    """Prompts ordered by the time they are available at, and the leases on them."""

    def __init__(self) -> None:
        self._order = SortedList()  # (available_ms, prompt_id); ties go by id
        self._available_ms: dict[str, int] = {}
        self._leases: dict[str, tuple[int, list[str]]] = {}
        self._expiries: list[tuple[int, str]] = []  # heap, to forget expired leases
        self._current: dict[str, str] = {}
        self._next_lease = 0
        self._sequence = 0

    def add_new(self, prompt_id: str) -> None:
        self._sequence += 1
        self._set(prompt_id, codec.new_prompt_ms(self._sequence))

    def _set(self, prompt_id: str, available_ms: int) -> None:
        old = self._available_ms.get(prompt_id)
        if old is not None:
            self._order.remove((old, prompt_id))
        self._order.add((available_ms, prompt_id))
        self._available_ms[prompt_id] = available_ms

    def lease(self, max_prompts: int, now_ms: int, expires_ms: int) -> tuple[str, list[str]]:
        self._forget_expired(now_ms)
        available = self._order.bisect_left((now_ms + 1,))
        taken = [p for _, p in self._order.islice(0, min(available, max_prompts))]
        if not taken:
            return "", []
        self._next_lease += 1
        lease_id = f"l{self._next_lease}"
        for prompt_id in taken:
            self._set(prompt_id, expires_ms)
            self._current[prompt_id] = lease_id
        self._leases[lease_id] = (expires_ms, taken)
        heapq.heappush(self._expiries, (expires_ms, lease_id))
        return lease_id, taken

    def acknowledge(self, lease_id: str, now_ms: int) -> None:
        """The lease's prompts that are still under it go to the back of the rotation,
        unless it has expired (then they are available already)."""
        expires_ms, prompt_ids = self._leases.pop(lease_id, (0, []))
        for prompt_id in prompt_ids:
            if self._current.get(prompt_id) == lease_id:
                del self._current[prompt_id]
                if now_ms < expires_ms:
                    self._set(prompt_id, now_ms)

    def _forget_expired(self, now_ms: int) -> None:
        while self._expiries and self._expiries[0][0] <= now_ms:
            _, lease_id = heapq.heappop(self._expiries)
            for prompt_id in self._leases.pop(lease_id, (0, []))[1]:
                if self._current.get(prompt_id) == lease_id:
                    del self._current[prompt_id]

    def in_flight(self, now_ms: int) -> int:
        return len(self._order) - self._order.bisect_left((now_ms + 1,))


@dataclass(slots=True)
class _Stored:
    trajectory: Trajectory
    digest: str
    bin: int


class _Trajectories:
    """Stored trajectories and every index and aggregate over them."""

    def __init__(self, limits: StoreLimits) -> None:
        self._limits = limits
        self.by_id: OrderedDict[int, _Stored] = OrderedDict()  # id order: oldest first
        self.history: dict[str, OrderedDict[int, None]] = {}
        self._digests: dict[str, dict[str, int]] = {}
        # (newest policy version, newest id, prompt id): the recency window's order
        self.recency = SortedList()
        self.recency_of: dict[str, tuple[int, int]] = {}
        self.ranked = SortedList()
        self.per_version: dict[int, int] = {}
        self.histogram = [0] * (len(limits.reward_histogram_edges) - 1)
        self.reward_sum = 0.0
        self._next_id = 0
        # Trajectories held at most: `capacity`, or less once growth is frozen.
        self.capacity = limits.capacity
        self.frozen = False

    def add(self, t: Trajectory, searcher_id: str) -> tuple[int, int]:
        """Stores a copy of `t` under a new id and `searcher_id`; returns (replaced duplicates,
        evicted)."""
        self._next_id += 1
        digest = codec.completion_digest(t.completion_token_ids)
        replaced = evicted = 0
        old = self._digests.get(t.prompt_id, {}).get(digest) if self._limits.dedup else None
        if old is not None:
            self._remove(old)
            replaced = 1
        self._insert(dataclasses.replace(t, id=self._next_id, searcher_id=searcher_id), digest)
        history = self.history[t.prompt_id]
        if len(history) > self._limits.prompt_history:
            self._remove(next(iter(history)))
            evicted += 1
        if len(self.by_id) > self.capacity:
            self._remove(next(iter(self.by_id)))
            evicted += 1
        return replaced, evicted

    def freeze(self) -> int:
        """Caps the trajectories held at what is held now, once (`BufferStore.freeze_growth`)."""
        if not self.frozen:
            self.capacity = min(self.capacity, max(len(self.by_id), 1))
            self.frozen = True
        return self.capacity

    def _insert(self, t: Trajectory, digest: str) -> None:
        edges = self._limits.reward_histogram_edges
        stored = _Stored(t, digest, codec.reward_bin(edges, t.reward))
        self.by_id[t.id] = stored
        history = self.history.setdefault(t.prompt_id, OrderedDict())
        history[t.id] = None
        if self._limits.dedup:
            self._digests.setdefault(t.prompt_id, {})[digest] = t.id
        if len(history) == 1:
            self.ranked.add(t.prompt_id)
        self._move_up(t.prompt_id, (t.policy_version, t.id))
        version = t.policy_version
        self.per_version[version] = self.per_version.get(version, 0) + 1
        self.histogram[stored.bin] += 1
        self.reward_sum += t.reward

    def _move_up(self, prompt_id: str, newest: tuple[int, int]) -> None:
        """A prompt moves up the recency window only, as in add_trajectories.lua."""
        kept = self.recency_of.get(prompt_id)
        if kept is None or newest > kept:
            if kept is not None:
                self.recency.remove((*kept, prompt_id))
            self.recency.add((*newest, prompt_id))
            self.recency_of[prompt_id] = newest

    def _remove(self, trajectory_id: int) -> None:
        stored = self.by_id.pop(trajectory_id)
        t = stored.trajectory
        history = self.history[t.prompt_id]
        del history[trajectory_id]
        digests = self._digests.get(t.prompt_id, {})
        if digests.get(stored.digest) == trajectory_id:
            del digests[stored.digest]
        self.per_version[t.policy_version] -= 1
        if not self.per_version[t.policy_version]:
            del self.per_version[t.policy_version]
        self.histogram[stored.bin] -= 1
        self.reward_sum -= t.reward
        if not history:
            del self.history[t.prompt_id]
            self._digests.pop(t.prompt_id, None)
            self.recency.remove((*self.recency_of.pop(t.prompt_id), t.prompt_id))
            self.ranked.remove(t.prompt_id)


@dataclass(frozen=True, slots=True)
class _Request:
    """What an AddTrajectories request id is remembered with, until `expires_ms`."""

    expires_ms: int
    result: AddResult
    digest: str


class MemoryStore:
    """`BufferStore` in process memory; nothing survives the process."""

    def __init__(self, limits: StoreLimits) -> None:
        self._limits = limits
        self._prompts: dict[str, Prompt] = {}
        self._next_prompt = 0
        self._pool = _Pool()
        self._store = _Trajectories(limits)
        self._requests: dict[str, _Request] = {}
        self._request_expiries: list[tuple[int, str]] = []  # heap, to forget old ids
        self._seen_s: dict[str, float] = {}
        self._added: dict[str, int] = {}
        self._added_total = 0
        self._evicted_total = 0
        self._groups_total = 0
        self._weights: WeightVersion | None = None
        self._run: Run | None = None
        self._history = SortedList()  # (at_s, encoded point)

    async def put_prompts(self, prompts: Sequence[Prompt]) -> PutPromptsResult:
        ids = []
        created = 0
        for prompt in prompts:
            prompt_id = prompt.id or self._new_prompt_id()
            if prompt_id not in self._prompts:
                self._prompts[prompt_id] = dataclasses.replace(prompt, id=prompt_id)
                self._pool.add_new(prompt_id)
                created += 1
            ids.append(prompt_id)
        return PutPromptsResult(prompt_ids=ids, created=created)

    def _new_prompt_id(self) -> str:
        while True:
            self._next_prompt += 1
            prompt_id = f"p{self._next_prompt}"
            if prompt_id not in self._prompts:
                return prompt_id

    async def get_prompts(self, prompt_ids: Sequence[str]) -> dict[str, Prompt]:
        return {p: self._prompts[p] for p in prompt_ids if p in self._prompts}

    async def lease_prompts(
        self, searcher_id: str, max_prompts: int, *, lease_s: float, now_s: float
    ) -> Lease:
        self._seen_s[searcher_id] = now_s
        expires_ms = codec.to_ms(now_s + lease_s)
        lease_id, prompt_ids = self._pool.lease(max_prompts, codec.to_ms(now_s), expires_ms)
        if not lease_id:
            return Lease("", [], 0.0)
        return Lease(lease_id, [self._prompts[p] for p in prompt_ids], now_s + lease_s)

    async def add_trajectories(
        self,
        trajectories: Sequence[Trajectory],
        *,
        request_id: str,
        searcher_id: str,
        lease_id: str,
        now_s: float,
        digest: str,
        run_id: str = "",
    ) -> AddResult:
        check_tagged(self._run.run_id if self._run else "", run_id)
        now_ms = codec.to_ms(now_s)
        self._forget_requests(now_ms)
        seen = self._requests.get(request_id)
        if seen is not None and now_ms < seen.expires_ms:
            if seen.digest != digest:
                raise FailedPreconditionError(reused_request_id(request_id))
            return dataclasses.replace(seen.result, replayed=True)
        replaced = evicted = 0
        for t in trajectories:
            r, e = self._store.add(t, searcher_id)
            replaced += r
            evicted += e
        result = AddResult(len(trajectories), replaced, evicted)
        self._seen_s[searcher_id] = now_s
        self._added[searcher_id] = self._added.get(searcher_id, 0) + len(trajectories)
        self._added_total += len(trajectories)
        self._evicted_total += evicted
        expires_ms = codec.to_ms(now_s + self._limits.request_id_ttl_s)
        self._requests[request_id] = _Request(expires_ms, result, digest)
        heapq.heappush(self._request_expiries, (expires_ms, request_id))
        if lease_id:
            self._pool.acknowledge(lease_id, now_ms)
        return result

    def _forget_requests(self, now_ms: int) -> None:
        while self._request_expiries and self._request_expiries[0][0] <= now_ms:
            expires_ms, request_id = heapq.heappop(self._request_expiries)
            seen = self._requests.get(request_id)
            if seen is not None and seen.expires_ms == expires_ms:
                del self._requests[request_id]

    async def freeze_growth(self) -> int:
        return self._store.freeze()

    async def draw_prompts(self, draw: PromptDraw) -> DrawnPrompts:
        store = self._store
        window = [p for *_, p in itertools.islice(reversed(store.recency), draw.window)]
        sources = sampling.choose_prompts(window, store.ranked, draw)
        latest_version = self._weights.version if self._weights else 0
        floor = sampling.candidate_floor(draw, latest_version)
        return DrawnPrompts(
            latest_version=latest_version,
            sources=sources,
            candidates={
                p: sampling.usable_candidates(
                    map(self._candidate, reversed(store.history[p])), source, draw, floor
                )
                for p, source in sources.items()
            },
            prompts={p: self._prompts[p] for p in sources},
        )

    def _candidate(self, trajectory_id: int) -> Candidate:
        t = self._store.by_id[trajectory_id].trajectory
        return Candidate(trajectory_id, t.reward, t.policy_version)

    async def get_trajectories(self, trajectory_ids: Sequence[int]) -> list[Trajectory]:
        by_id = self._store.by_id
        return [dataclasses.replace(by_id[i].trajectory) for i in trajectory_ids if i in by_id]

    async def read_sampled(self, groups: Sequence[Sequence[int]]) -> list[list[Trajectory]]:
        read = [await self.get_trajectories(ids) for ids in groups]
        self._groups_total += sum(1 for trajectories in read if trajectories)
        return read

    async def counters(self, now_s: float) -> StoreCounters:
        store = self._store
        searchers = [
            SearcherInfo(s, self._seen_s[s], self._added.get(s, 0)) for s in sorted(self._seen_s)
        ]
        return StoreCounters(
            trajectories=len(store.by_id),
            prompts=len(self._prompts),
            prompts_with_trajectories=len(store.ranked),
            leases_in_flight=self._pool.in_flight(codec.to_ms(now_s)),
            reward_sum=store.reward_sum,
            reward_histogram_counts=list(store.histogram),
            per_version=dict(sorted(store.per_version.items())),
            searchers=searchers,
            trajectories_added_total=self._added_total,
            groups_sampled_total=self._groups_total,
            evicted_total=self._evicted_total,
        )

    async def announce_weights(self, weights: WeightVersion) -> None:
        if self._weights is not None and weights.version <= self._weights.version:
            raise FailedPreconditionError(
                f"weight version {weights.version} is not newer than {self._weights.version}"
            )
        self._weights = weights

    async def latest_weights(self) -> WeightVersion | None:
        return self._weights

    async def register_run(self, run: Run) -> Run:
        if self._run is None:
            self._run = run
        return self._run

    async def current_run(self) -> Run | None:
        return self._run

    async def append_history(self, point: history.HistoryPoint) -> None:
        # (time, encoded point): ordered and deduplicated as Redis orders a ZSET.
        entry = (point.at_s, history.encode_point(point))
        if entry not in self._history:
            self._history.add(entry)
        cutoff = bisect_right_time(self._history, point.at_s - self._limits.history_span_s)
        del self._history[:cutoff]
        excess = len(self._history) - self._limits.history_max_points
        if excess > 0:
            del self._history[:excess]

    async def history(self, since_s: float) -> list[history.HistoryPoint]:
        start = bisect_right_time(self._history, since_s)
        return [history.decode_point(text) for _, text in self._history.islice(start)]

    async def close(self) -> None:
        """Nothing to release: the data lives and dies with the process."""


def bisect_right_time(entries: SortedList, at_s: float) -> int:
    """The index of the first (time, text) entry with a time after `at_s`."""
    return entries.bisect_right((at_s, "\U0010ffff"))
