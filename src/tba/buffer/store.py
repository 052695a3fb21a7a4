"""The storage interface of the buffer. Two implementations share one contract suite
(tests/integration/test_store_contract.py): `MemoryStore` (embedded, one process) and
`RedisStore` (persistent).

Stores own state and atomicity; the sampling maths live in `tba.buffer.sampling` and the
validation in `tba.buffer.service`, so both stores behave the same by construction. The one
exception is the choice of a draw's prompts from the caller's uniforms, which Redis makes in
the same round trip that reads their candidates (lua/draw_prompts.lua mirrors
`sampling.choose_prompts`; tests/integration/test_store_equivalence.py holds them together).
Every method is O(size of its arguments) or O(per-prompt history), never O(buffer size).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from tba.buffer.history import HistoryPoint
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
from tba.errors import InvalidArgumentError
from tba.runs import Run


@dataclass(frozen=True, slots=True)
class Candidate:
    """What sampling needs to know of a stored trajectory, without loading it."""

    trajectory_id: int
    reward: float
    policy_version: int


@dataclass(frozen=True, slots=True)
class PromptDraw:
    """One round of a draw's prompt choice (`sampling.choose_prompts`): up to
    len(recent_uniforms) distinct prompts, `wanted_recent` of them among the `window` first in
    the recency order, the rest by rank, none in `exclude`; and which of their candidates the
    round reads (`sampling.usable_candidates`): those of policy version `min_version` or newer
    (None: `max_age_versions` behind the round's latest version; None too: every version),
    and of a prompt chosen by recency only the newest `recent_candidates` (0: all)."""

    window: int
    wanted_recent: int
    recent_uniforms: tuple[float, ...]
    reward_uniforms: tuple[float, ...]
    exclude: frozenset[str]
    recent_candidates: int = 0
    max_age_versions: int | None = None
    min_version: int | None = None


@dataclass(frozen=True, slots=True)
class DrawnPrompts:
    """A round's prompts, each with its source, the candidates the draw asked for among its
    stored trajectories (oldest first) and the prompt itself, and the newest announced
    weight version (0 before any)."""

    latest_version: int
    sources: dict[str, SampleSource]
    candidates: dict[str, list[Candidate]]
    prompts: dict[str, Prompt]


@dataclass(frozen=True, slots=True)
class StoreLimits:
    capacity: int
    prompt_history: int
    dedup: bool
    request_id_ttl_s: float
    reward_histogram_edges: tuple[float, ...]
    # History points older than the newest point's time minus this are forgotten, and the
    # oldest beyond the count (`history.max_points`).
    history_span_s: float = 86_400.0
    history_max_points: int = 34_560


@dataclass(frozen=True, slots=True)
class StoreCounters:
    trajectories: int
    prompts: int
    prompts_with_trajectories: int
    leases_in_flight: int
    reward_sum: float
    reward_histogram_counts: list[int]
    per_version: dict[int, int]
    searchers: list[SearcherInfo]
    trajectories_added_total: int
    groups_sampled_total: int
    evicted_total: int


def reused_request_id(request_id: str) -> str:
    """Both stores' message for a request id reused for another batch."""
    return (
        f"request id {request_id!r} was already used for a different batch: a retry must "
        "resend the same batch, and a new batch needs a new request id"
    )


class BufferStore(Protocol):
    async def put_prompts(self, prompts: Sequence[Prompt]) -> PutPromptsResult:
        """Adds prompts to the pool; an empty id gets a new one, an existing id is kept as is."""
        ...

    async def get_prompts(self, prompt_ids: Sequence[str]) -> dict[str, Prompt]:
        """The prompts that exist among `prompt_ids`."""
        ...

    async def lease_prompts(
        self, searcher_id: str, max_prompts: int, *, lease_s: float, now_s: float
    ) -> Lease:
        """Takes up to `max_prompts` available prompts, least recently leased first.
        A prompt is available again once its lease is acknowledged or expired."""
        ...

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
        """Atomically stores validated trajectories of existing prompts, each under
        `searcher_id` (whatever its own field says), enforcing dedup, per-prompt history and
        capacity. First, `run_id` must be the registered run's
        (`runs.check_tagged`: empty only while none is), else FailedPreconditionError.
        `digest` identifies the request's content (`codec.request_digest`) and is kept
        with `request_id`: a repeated id with the same digest returns the first result,
        with another one raises FailedPreconditionError and changes nothing. An id kept
        without a digest (stored before digests were) returns its first result whatever
        the digest."""
        ...

    async def freeze_growth(self) -> int:
        """Stops the buffer's growth: from now on it holds at most the trajectories it holds
        now (at least 1, at most `capacity`), each add beyond that evicting the oldest as
        `capacity` does. The first call sets the cap and later calls keep it (Redis keeps it
        across restarts). Returns the cap."""
        ...

    async def draw_prompts(self, draw: PromptDraw) -> DrawnPrompts:
        """The prompts `sampling.choose_prompts` picks for `draw` among those with
        trajectories (the window: by each prompt's newest policy version, then its newest
        trajectory id, a prompt moving up only; ranks: by prompt id), read with the
        candidates it asks for and the latest weight version in one consistent view."""
        ...

    async def get_trajectories(self, trajectory_ids: Sequence[int]) -> list[Trajectory]:
        """The stored trajectories, in the order asked (missing ones, just evicted, skipped)."""
        ...

    async def read_sampled(self, groups: Sequence[Sequence[int]]) -> list[list[Trajectory]]:
        """Each group's stored trajectories, in the order asked (missing ones, evicted since
        they were drawn, skipped), and counts the groups that still have any as sampled
        (`groups_sampled_total`), in one step: a Sample's answer costs one round trip."""
        ...

    async def counters(self, now_s: float) -> StoreCounters: ...

    async def announce_weights(self, weights: WeightVersion) -> None:
        """Records a new latest version; FailedPreconditionError unless it is newer."""
        ...

    async def latest_weights(self) -> WeightVersion | None: ...

    async def register_run(self, run: Run) -> Run:
        """Atomically records `run` when no run is registered; returns the registered run:
        `run`, or the one registered before, unchanged."""
        ...

    async def current_run(self) -> Run | None: ...

    async def append_history(self, point: HistoryPoint) -> None:
        """Keeps `point`, then forgets the points older than its `at_s` minus
        `history_span_s`, and the oldest beyond `history_max_points`."""
        ...

    async def history(self, since_s: float) -> list[HistoryPoint]:
        """The kept points with `at_s` after `since_s`, oldest first."""
        ...

    async def close(self) -> None: ...


REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


def open_buffer_store(url: str, key_prefix: str, limits: StoreLimits) -> BufferStore:
    """`memory` for the embedded store, or a redis:// (rediss://, unix://) URL."""
    # Imported here: only a Redis deployment may import redis, and both stores import this
    # module for the contract's types.
    if url == "memory":
        from tba.buffer.memory_store import MemoryStore

        return MemoryStore(limits)
    if url.startswith(REDIS_SCHEMES):
        from tba.buffer.redis_store import RedisStore

        return RedisStore(url, key_prefix, limits)
    raise InvalidArgumentError(f"unknown store {url!r}: use `memory` or a redis:// URL")
