"""The persistent store: the buffer in Redis, the only module that imports `redis`.

Every mutation is one Lua script (lua/*.lua, run with EVALSHA and loaded again after
NOSCRIPT, e.g. after a Redis restart), so it applies whole or not at all and one call costs
one round trip. Scripts receive `now` from here, so replaying the AOF is deterministic.
Keys live under `{key_prefix}:`; per trajectory there is one blob field and one meta field
("version bin reward digest prompt_id"), not a key. A prompt has a history ZSET (`h:`) and,
with dedup, a digest HASH (`d:`). Prompt-level indexes: `pool` (by available-at ms),
`recency` (score 0, members "version:id:prompt" in fixed-width digits: by each prompt's newest
policy version, then newest id; `recency_of` holds each prompt's "version:id:"), `oldest` (by
oldest id: global eviction), `ranked` (score 0, by id: random access by rank). A buffer
written before `recency` (its `recent` ZSET by id alone is no longer read) fills its
recency window again as prompts get new completions. `state` holds counters and, once growth is
frozen, `frozen_capacity`. The history is a ZSET of JSON points by time
(`history`), trimmed by time and count in the same MULTI as each append.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from importlib import resources
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from tba.buffer import codec, history
from tba.buffer.access import redact_url
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
    SampleSource,
    SearcherInfo,
    Trajectory,
    WeightVersion,
)
from tba.errors import FailedPreconditionError, UnavailableError
from tba.runs import Run, check_tagged

SCRIPTS = (
    "put_prompts",
    "lease_prompts",
    "add_trajectories",
    "draw_prompts",
    "read_sampled",
    "announce_weights",
    "register_run",
    "freeze_growth",
)
# add_trajectories.lua's status: stored (0), replayed, the request id kept with another
# digest, or a batch of another run than the registered one.
_REPLAYED, _OTHER_DIGEST, _OTHER_RUN = 1, 2, 3
# Expired leases and request ids forgotten per call; each call adds at most one.
FORGET_PER_CALL = 8
DEFAULT_TIMEOUT_S = 10.0


def _script_source(name: str) -> str:
    lua = resources.files("tba.buffer") / "lua"
    return (lua / "common.lua").read_text() + (lua / f"{name}.lua").read_text()


@contextlib.contextmanager
def _unavailable_on_connection_error(url: str) -> Iterator[None]:
    try:
        yield
    except (RedisConnectionError, RedisTimeoutError) as e:
        raise UnavailableError(f"redis at {redact_url(url)} cannot be reached: {e}") from e


class RedisStore:
    """`BufferStore` in one Redis database (standalone, not cluster: scripts derive keys)."""

    def __init__(
        self,
        url: str,
        key_prefix: str,
        limits: StoreLimits,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self._url = url
        self._prefix = key_prefix
        self._limits = limits
        # No retries in the client: a retried script could apply twice; callers retry.
        # RESP2: under RESP3 redis-py 8 skips its check for connections the server closed,
        # so the first call after a Redis restart would fail on a dead socket.
        self._redis = aioredis.from_url(
            url,
            protocol=2,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 0),
        )
        self._scripts = {n: self._redis.register_script(_script_source(n)) for n in SCRIPTS}

    def _key(self, name: str) -> str:
        return f"{self._prefix}:{name}"

    async def _run(self, script: str, args: Sequence[Any]) -> Any:
        with _unavailable_on_connection_error(self._url):
            return await self._scripts[script](keys=[self._prefix], args=args)

    async def put_prompts(self, prompts: Sequence[Prompt]) -> PutPromptsResult:
        args: list[Any] = [codec.NEW_PROMPT_MS_BASE]
        for prompt in prompts:
            args += [prompt.id, codec.encode_prompt(prompt)]
        created, ids = await self._run("put_prompts", args)
        return PutPromptsResult(prompt_ids=[i.decode() for i in ids], created=int(created))

    async def get_prompts(self, prompt_ids: Sequence[str]) -> dict[str, Prompt]:
        if not prompt_ids:
            return {}
        with _unavailable_on_connection_error(self._url):
            blobs: Any = await self._redis.hmget(self._key("prompts"), list(prompt_ids))
        return {p: codec.decode_prompt(p, b) for p, b in zip(prompt_ids, blobs, strict=True) if b}

    async def lease_prompts(
        self, searcher_id: str, max_prompts: int, *, lease_s: float, now_s: float
    ) -> Lease:
        expires_ms = codec.to_ms(now_s + lease_s)
        args = [searcher_id, max_prompts, codec.to_ms(now_s), expires_ms, repr(now_s)]
        reply = await self._run("lease_prompts", [*args, FORGET_PER_CALL])
        if not reply:
            return Lease("", [], 0.0)
        lease_id, ids, blobs = reply
        prompts = [codec.decode_prompt(i.decode(), b) for i, b in zip(ids, blobs, strict=True)]
        return Lease(lease_id.decode(), prompts, now_s + lease_s)

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
        limits = self._limits
        args: list[Any] = [request_id, searcher_id, lease_id, codec.to_ms(now_s), repr(now_s)]
        args += [codec.to_ms(now_s + limits.request_id_ttl_s), int(limits.dedup)]
        args += [limits.prompt_history, limits.capacity, FORGET_PER_CALL, digest, run_id]
        edges = limits.reward_histogram_edges
        for t in trajectories:
            completion = codec.completion_digest(t.completion_token_ids)
            meta = f"{t.policy_version} {codec.reward_bin(edges, t.reward)} {t.reward!r}"
            args += [codec.encode_trajectory(t, searcher_id), f"{meta} {completion} {t.prompt_id}"]
        status, result = await self._run("add_trajectories", args)
        if status == _OTHER_RUN:
            check_tagged(result.decode(), run_id)
        if status == _OTHER_DIGEST:
            raise FailedPreconditionError(reused_request_id(request_id))
        accepted, replaced, evicted = (int(n) for n in result.split()[:3])
        return AddResult(accepted, replaced, evicted, replayed=status == _REPLAYED)

    async def freeze_growth(self) -> int:
        return int(await self._run("freeze_growth", [self._limits.capacity]))

    async def draw_prompts(self, draw: PromptDraw) -> DrawnPrompts:
        args: list[Any] = [draw.window, draw.wanted_recent, draw.recent_candidates]
        args += [_or_minus_1(draw.max_age_versions), _or_minus_1(draw.min_version)]
        args += [len(draw.recent_uniforms)]
        args += [repr(u) for u in draw.recent_uniforms]
        args += [len(draw.reward_uniforms), *(repr(u) for u in draw.reward_uniforms)]
        version, ids, flags, found, blobs = await self._run("draw_prompts", [*args, *draw.exclude])
        prompt_ids = [i.decode() for i in ids]
        return DrawnPrompts(
            latest_version=int(version),
            sources={
                p: SampleSource.RECENCY if flag else SampleSource.REWARD
                for p, flag in zip(prompt_ids, flags, strict=True)
            },
            candidates={
                p: [_candidate(i, m) for i, m in zip(*pair, strict=True)]
                for p, pair in zip(prompt_ids, found, strict=True)
            },
            prompts={
                p: codec.decode_prompt(p, b) for p, b in zip(prompt_ids, blobs, strict=True) if b
            },
        )

    async def get_trajectories(self, trajectory_ids: Sequence[int]) -> list[Trajectory]:
        if not trajectory_ids:
            return []
        with _unavailable_on_connection_error(self._url):
            blobs: Any = await self._redis.hmget(self._key("blob"), list(trajectory_ids))
        return [
            codec.decode_trajectory(b, i)
            for i, b in zip(trajectory_ids, blobs, strict=True)
            if b is not None
        ]

    async def read_sampled(self, groups: Sequence[Sequence[int]]) -> list[list[Trajectory]]:
        if not groups:
            return []
        blobs = await self._run("read_sampled", [x for ids in groups for x in (len(ids), *ids)])
        read, at = [], 0
        for ids in groups:
            found = zip(ids, blobs[at : at + len(ids)], strict=True)
            read.append([codec.decode_trajectory(b, i) for i, b in found if b is not None])
            at += len(ids)
        return read

    async def counters(self, now_s: float) -> StoreCounters:
        bins = len(self._limits.reward_histogram_edges) - 1
        with _unavailable_on_connection_error(self._url):
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.hlen(self._key("meta"))
                pipe.hlen(self._key("prompts"))
                pipe.zcard(self._key("ranked"))
                pipe.zcount(self._key("pool"), f"({codec.to_ms(now_s)}", "+inf")
                pipe.hmget(self._key("state"), ["reward_sum", "added_total", "evicted_total"])
                pipe.hget(self._key("state"), "groups_total")
                pipe.hmget(self._key("hist"), list(range(bins)))
                pipe.hgetall(self._key("versions"))
                pipe.hgetall(self._key("seen"))
                pipe.hgetall(self._key("added"))
                replies = await pipe.execute()
        trajectories, prompts, ranked, in_flight, totals, groups, hist, *rest = replies
        versions, seen, added = rest
        reward_sum, added_total, evicted_total = totals
        searchers = [
            SearcherInfo(s.decode(), float(seen[s]), int(added.get(s, 0))) for s in sorted(seen)
        ]
        return StoreCounters(
            trajectories=trajectories,
            prompts=prompts,
            prompts_with_trajectories=ranked,
            leases_in_flight=in_flight,
            reward_sum=float(reward_sum or 0.0),
            reward_histogram_counts=[int(c or 0) for c in hist],
            per_version=dict(sorted((int(v), int(c)) for v, c in versions.items())),
            searchers=searchers,
            trajectories_added_total=int(added_total or 0),
            groups_sampled_total=int(groups or 0),
            evicted_total=int(evicted_total or 0),
        )

    async def announce_weights(self, weights: WeightVersion) -> None:
        args = [weights.version, weights.uri, weights.sha256, weights.step]
        reply = await self._run("announce_weights", [*args, repr(weights.published_at_s)])
        if not reply[0]:
            raise FailedPreconditionError(
                f"weight version {weights.version} is not newer than {int(reply[1])}"
            )

    async def latest_weights(self) -> WeightVersion | None:
        with _unavailable_on_connection_error(self._url):
            fields: Any = await self._redis.hgetall(self._key("weights"))
        if not fields:
            return None
        return WeightVersion(
            version=int(fields[b"version"]),
            uri=fields[b"uri"].decode(),
            sha256=fields[b"sha256"].decode(),
            step=int(fields[b"step"]),
            published_at_s=float(fields[b"published_at_s"]),
        )

    async def register_run(self, run: Run) -> Run:
        registered = await self._run("register_run", [run.run_id, codec.encode_run(run)])
        return codec.decode_run(registered)

    async def current_run(self) -> Run | None:
        with _unavailable_on_connection_error(self._url):
            text: Any = await self._redis.get(self._key("run"))
        return codec.decode_run(text) if text else None

    async def append_history(self, point: history.HistoryPoint) -> None:
        key, limits = self._key("history"), self._limits
        with _unavailable_on_connection_error(self._url):
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.zadd(key, {history.encode_point(point): point.at_s})
                pipe.zremrangebyscore(key, "-inf", point.at_s - limits.history_span_s)
                pipe.zremrangebyrank(key, 0, -limits.history_max_points - 1)
                await pipe.execute()

    async def history(self, since_s: float) -> list[history.HistoryPoint]:
        with _unavailable_on_connection_error(self._url):
            texts: Any = await self._redis.zrangebyscore(
                self._key("history"), f"({since_s!r}", "+inf"
            )
        return [history.decode_point(t) for t in texts]

    async def close(self) -> None:
        await self._redis.aclose()


def _or_minus_1(value: int | None) -> int:
    return -1 if value is None else value


def _candidate(trajectory_id: bytes, meta: bytes) -> Candidate:
    version, _bin, reward, _ = meta.split(b" ", 3)
    return Candidate(int(trajectory_id), float(reward), int(version))
