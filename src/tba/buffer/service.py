"""The buffer's domain service: validates requests, runs the sampling maths over a store, and
keeps rates. Transports (gRPC servicer, REST handlers) only translate and delegate here."""

from __future__ import annotations

import collections
import dataclasses
import logging
import math
import time
from collections.abc import Callable, Sequence

import numpy as np

from tba.buffer import codec, sampling, validation, waiting
from tba.buffer.config import BufferSettings
from tba.buffer.history import Evaluation, HistoryPoint, buffer_point
from tba.buffer.store import BufferStore, DrawnPrompts
from tba.domain import (
    AddResult,
    Batch,
    BufferStats,
    Lease,
    Prompt,
    PromptGroup,
    PutPromptsResult,
    SampleSource,
    SampleSpec,
    TrainerReport,
    Trajectory,
    WeightVersion,
)
from tba.errors import FailedPreconditionError, InvalidArgumentError
from tba.runs import Run, RunIdentity, check_joins, check_registers

_TOP_UP_ROUNDS = 3
log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class _Selection:
    """A draw's choice before its trajectories are read: (prompt, trajectory ids, source)
    per group, in the order chosen; the latest version it saw, and its age cut."""

    groups: list[tuple[Prompt, list[int], SampleSource]]
    latest_version: int
    min_version: int


class RateMeter:
    """Events per second over a sliding window."""

    def __init__(self, window_s: float, clock: Callable[[], float]) -> None:
        self._window_s = window_s
        self._clock = clock
        self._started_s = clock()
        self._events: collections.deque[tuple[float, int]] = collections.deque()

    def add(self, count: int) -> None:
        self._events.append((self._clock(), count))

    def per_s(self) -> float:
        now = self._clock()
        while self._events and self._events[0][0] < now - self._window_s:
            self._events.popleft()
        span_s = min(self._window_s, max(now - self._started_s, 1e-9))
        return sum(n for _, n in self._events) / span_s


class BufferService:
    def __init__(
        self,
        store: BufferStore,
        settings: BufferSettings,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.settings = settings
        self._clock = clock
        self._adds = RateMeter(settings.rate_window_s, clock)
        self._samples = RateMeter(settings.rate_window_s, clock)
        self._add_slots = waiting.FreshFirstSlots(
            settings.adds_in_flight, settings.adds_fresh_first_max_wait_s
        )
        self._fresh = waiting.VersionWatch()
        self._announced = waiting.VersionWatch()
        self._draws = waiting.DrawGate()
        # The trainer's latest report since the previous history point.
        self._report: TrainerReport | None = None
        # The cap the buffer's growth was frozen at (`freeze_growth_after_step`); None: not yet.
        self.frozen_capacity: int | None = None

    async def put_prompts(self, prompts: Sequence[Prompt]) -> PutPromptsResult:
        validation.check_prompts(prompts, self.settings)
        return await self.store.put_prompts(prompts)

    async def lease_prompts(self, searcher_id: str, max_prompts: int, lease_s: float) -> Lease:
        validation.check_lease(searcher_id, max_prompts, lease_s, self.settings)
        lease_s = lease_s or self.settings.lease_s
        return await self.store.lease_prompts(
            searcher_id, max_prompts, lease_s=lease_s, now_s=self._clock()
        )

    async def add_trajectories(
        self,
        trajectories: Sequence[Trajectory],
        *,
        request_id: str,
        searcher_id: str,
        lease_id: str,
        run_id: str = "",
    ) -> AddResult:
        """Stores the batch once per `request_id`: a retry of the same batch gets the first
        result (`replayed`); the id reused for another batch is FailedPreconditionError, and
        so is a batch of another run than the registered one (`runs.check_tagged`). Each
        trajectory is stored under the request's `searcher_id` (the buffer owns that field;
        `created_at_s` is the sender's). At most `adds_in_flight` calls are worked on at
        once; the rest wait here, before any of their work, the newest policy version first
        (`FreshFirstSlots`). One whose turn comes while Sample draws run starts after them,
        and each chunk of at most `add_chunk_size` that is ready to store while draws run
        stores after them (its script would hold up their round trips in the store). A retry
        whose chunks were all stored before is `replayed`."""
        newest_version = max((t.policy_version for t in trajectories), default=0)
        return await self.add_received(
            newest_version,
            lambda: trajectories,
            request_id=request_id,
            searcher_id=searcher_id,
            lease_id=lease_id,
            run_id=run_id,
        )

    async def add_received(
        self,
        newest_version: int,
        convert: Callable[[], Sequence[Trajectory]],
        *,
        request_id: str,
        searcher_id: str,
        lease_id: str,
        run_id: str = "",
    ) -> AddResult:
        """`add_trajectories` for a transport: `convert` makes the trajectories from what it
        received once the call's turn comes (`newest_version`, the batch's newest policy
        version, places it among the waiting calls), so that calls waiting their turn take
        none of the event loop's time from a Sample."""
        async with self._add_slots.slot(newest_version):
            await self._draws.after_running_draws()
            return await self._add(
                convert(), request_id, searcher_id, lease_id, run_id, newest_version
            )

    async def _add(
        self,
        trajectories: Sequence[Trajectory],
        request_id: str,
        searcher_id: str,
        lease_id: str,
        run_id: str,
        newest_version: int,
    ) -> AddResult:
        validation.check_add(request_id, searcher_id, lease_id, trajectories, self.settings, run_id)
        digest = codec.request_digest(searcher_id, lease_id, trajectories)
        prompt_ids = {t.prompt_id for t in trajectories}
        known = await self.store.get_prompts(sorted(prompt_ids))
        unknown = sorted(prompt_ids - known.keys())
        if unknown:
            raise InvalidArgumentError(f"unknown prompt ids: {', '.join(unknown[:10])}")
        chunks = store_chunks(trajectories, request_id, self.settings.add_chunk_size)
        results = []
        for index, (chunk_request_id, chunk) in enumerate(chunks):
            last = index == len(chunks) - 1  # the lease is acknowledged once all is in
            request = (chunk_request_id, searcher_id, lease_id if last else "", digest, run_id)
            results.append(await self._store_chunk(chunk, *request))
        stored = sum(r.accepted for r in results if not r.replayed)
        self._adds.add(stored)
        if stored:  # a retry's replayed results stored nothing new
            self._fresh.reached(newest_version)
        return AddResult(
            accepted=sum(r.accepted for r in results),
            replaced_duplicates=sum(r.replaced_duplicates for r in results),
            evicted=sum(r.evicted for r in results),
            replayed=all(r.replayed for r in results),
        )

    async def _store_chunk(
        self,
        chunk: Sequence[Trajectory],
        request_id: str,
        searcher_id: str,
        lease_id: str,
        digest: str,
        run_id: str,
    ) -> AddResult:
        # After the draws running now: a chunk's script would hold up their round trips.
        await self._draws.after_running_draws()
        return await self.store.add_trajectories(
            chunk,
            request_id=request_id,
            searcher_id=searcher_id,
            lease_id=lease_id,
            now_s=self._clock(),
            digest=digest,
            run_id=run_id,
        )

    async def sample(self, spec: SampleSpec) -> Batch:
        """One draw of B groups; with `min_groups` and `wait_s`, a long poll: while a draw
        selects fewer than `min_groups` groups, waits for an add of completions it could use
        and draws again, until `wait_s` has passed (then answers the last draw). Each wait
        lasts at most `sample_recheck_s`, since adds served by another process on the same
        store wake nobody here."""
        validation.check_sample(spec, self.settings)
        if spec.report is not None:
            self._note_report(spec.report)
            await self._freeze_growth_when_due(spec.report.step)
        rng = np.random.default_rng(spec.seed)

        async def draw() -> tuple[tuple[_Selection, Batch | None], bool, int]:
            async with self._draws.drawing():
                selection = await self._draw(spec, rng)
                if len(selection.groups) < spec.min_groups:
                    return (selection, None), False, selection.min_version
                # Read in the same turn as the draw: no add's script queues before it.
                return (selection, await self._read(selection)), True, selection.min_version

        recheck_s = self.settings.sample_recheck_s
        drawn, waited_s = await waiting.long_poll(self._fresh, draw, spec.wait_s, recheck_s)
        selection, batch = drawn
        if batch is None:  # the wait ended on a draw short of `min_groups`
            async with self._draws.drawing():
                batch = await self._read(selection)
        self._samples.add(len(batch.groups))
        return dataclasses.replace(batch, waited_s=waited_s)

    async def _draw(self, spec: SampleSpec, rng: np.random.Generator) -> _Selection:
        """Up to B groups' trajectory ids, by reward and recency."""
        sources = sampling.plan_sources(spec.num_prompts, spec.recency_probability, rng)
        chosen: dict[str, SampleSource] = {}
        selected: dict[str, list[int]] = {}
        prompts: dict[str, Prompt] = {}
        latest_version, window = 0, self.settings.recency_window
        min_version: int | None = None  # the draw's age cut, fixed by its first round
        # A round chooses prompts and reads their candidates in one round trip (each one waits
        # behind the adds' scripts in Redis); another round tops up groups that fell short.
        for _ in range(_TOP_UP_ROUNDS):
            missing = sources[len(selected) :]
            if not missing:
                break
            draw = sampling.prompt_draw(
                missing,
                window,
                chosen,
                rng,
                recent_candidates=spec.samples_per_prompt,
                max_age_versions=spec.max_age_versions,
                min_version=min_version,
            )
            drawn = await self.store.draw_prompts(draw)
            if min_version is None:
                latest_version = drawn.latest_version
                min_version = sampling.candidate_floor(draw, latest_version)
            if not drawn.sources:
                break
            chosen.update(drawn.sources)
            prompts.update(drawn.prompts)
            selected.update(self._select(drawn, spec, min_version, rng))
        groups = [(prompts[p], ids, chosen[p]) for p, ids in selected.items() if p in prompts]
        return _Selection(groups, latest_version, min_version or 0)

    async def _read(self, selection: _Selection) -> Batch:
        """The selected groups whose trajectories are still there (an add may evict between
        a draw's round trips), in the order chosen, counted as sampled."""
        read = await self.store.read_sampled([ids for _, ids, _ in selection.groups])
        groups = [
            PromptGroup(prompt, trajectories, source)
            for (prompt, _, source), trajectories in zip(selection.groups, read, strict=True)
            if trajectories
        ]
        return Batch(groups=groups, latest_version=selection.latest_version)

    def _select(
        self, drawn: DrawnPrompts, spec: SampleSpec, min_version: int, rng: np.random.Generator
    ) -> dict[str, list[int]]:
        selected = {}
        for prompt_id, source in drawn.sources.items():
            ids = sampling.select_completions(
                drawn.candidates.get(prompt_id, []),
                spec.samples_per_prompt,
                source,
                spec.reward_temperature,
                min_version,
                rng,
            )
            if len(ids) >= spec.min_samples_per_prompt:
                selected[prompt_id] = ids
        return selected

    async def stats(self) -> BufferStats:
        counters = await self.store.counters(self._clock())
        latest = await self.store.latest_weights()
        return BufferStats(
            trajectories=counters.trajectories,
            prompts=counters.prompts,
            prompts_with_trajectories=counters.prompts_with_trajectories,
            leases_in_flight=counters.leases_in_flight,
            reward_mean=counters.reward_sum / counters.trajectories
            if counters.trajectories
            else 0.0,
            reward_histogram_edges=list(self.settings.reward_histogram_edges),
            reward_histogram_counts=counters.reward_histogram_counts,
            per_version=counters.per_version,
            latest_version=latest.version if latest else 0,
            searchers=counters.searchers,
            trajectories_added_total=counters.trajectories_added_total,
            groups_sampled_total=counters.groups_sampled_total,
            evicted_total=counters.evicted_total,
            adds_per_s=self._adds.per_s(),
            samples_per_s=self._samples.per_s(),
            run=await self.store.current_run(),
        )

    def now_s(self) -> float:
        return self._clock()

    async def _freeze_growth_when_due(self, trainer_step: int) -> None:
        """Freezes the buffer's growth once the trainer reports `freeze_growth_after_step`;
        after a restart the store keeps the first cap (Redis) and this learns it again."""
        due = growth_freeze_due(trainer_step, self.settings.freeze_growth_after_step)
        if self.frozen_capacity is None and due:
            self.frozen_capacity = await self.store.freeze_growth()
            log.info(
                "trainer step %d: buffer growth frozen at %d trajectories; the oldest are "
                "evicted beyond",
                trainer_step,
                self.frozen_capacity,
            )

    def _note_report(self, report: TrainerReport) -> None:
        """Keeps the report for the next history point; one with a value JSON cannot carry
        (a diverged loss) is left out of the history, not held against the Sample call."""
        values = dataclasses.astuple(report)
        if all(math.isfinite(v) for v in values):
            self._report = report
        else:
            log.warning("a trainer report with a non-finite value left out: %s", report)

    async def record_history(self) -> HistoryPoint:
        """Appends the buffer's state now, with the trainer's report since the last point."""
        now_s = self._clock()
        state = buffer_point(await self.stats(), now_s=now_s, active_window_s=self.settings.lease_s)
        point = HistoryPoint(at_s=now_s, buffer=state, trainer=self._report)
        await self.store.append_history(point)
        self._report = None
        return point

    async def record_evaluation(self, evaluation: Evaluation) -> HistoryPoint:
        """Appends a held-out evaluation of one weight version to the history."""
        validation.check_evaluation(evaluation)
        point = HistoryPoint(at_s=self._clock(), evaluation=evaluation)
        await self.store.append_history(point)
        return point

    async def history(self, since_s: float) -> list[HistoryPoint]:
        """The history points after `since_s` (unix seconds), oldest first."""
        if not math.isfinite(since_s):
            raise InvalidArgumentError(f"since must be a finite number of seconds, got {since_s}")
        return await self.store.history(since_s)

    async def announce_weights(self, weights: WeightVersion) -> None:
        validation.check_weights(weights)
        await self.store.announce_weights(weights)
        self._announced.reached(weights.version)

    async def latest_weights(self) -> WeightVersion | None:
        return await self.store.latest_weights()

    async def newer_weights(
        self, newer_than: int, wait_s: float
    ) -> tuple[WeightVersion | None, float]:
        """The latest announced version, and the seconds waited before the read it answers
        with; a long poll: while that version is not newer than `newer_than`, waits for an
        announcement, until `wait_s` has passed. Each wait lasts at most `sample_recheck_s`,
        since announcements another process on the same store served wake nobody here."""
        validation.check_weights_wait(newer_than, wait_s, self.settings)

        async def read() -> tuple[WeightVersion | None, bool, int]:
            latest = await self.store.latest_weights()
            return latest, latest is not None and latest.version > newer_than, newer_than + 1

        recheck_s = self.settings.sample_recheck_s
        return await waiting.long_poll(self._announced, read, wait_s, recheck_s)

    async def register_run(self, run: Run) -> Run:
        """Registers the trainer's run, or accepts it again when the buffer holds it (a
        resume); FailedPreconditionError naming what differs when it holds another."""
        validation.check_run(run, self.settings)
        stamped = dataclasses.replace(run, registered_at_s=self._clock())
        registered = await self.store.register_run(stamped)
        try:
            check_registers(registered, run)
        except FailedPreconditionError as exc:
            log.warning("refused a trainer's run: %s", exc)
            raise
        verb = "registered" if registered == stamped else "resumed"
        log.info("run %s %s: %s", run.run_id, verb, registered.identity)
        return registered

    async def join_run(self, searcher_id: str, identity: RunIdentity) -> Run | None:
        """The registered run (None while there is none); FailedPreconditionError naming
        each field where the searcher's `identity` contradicts it."""
        validation.check_id(searcher_id, "searcher_id")
        validation.check_identity(identity)
        registered = await self.store.current_run()
        if registered is None:
            return None
        try:
            check_joins(registered, identity, f"searcher {searcher_id}")
        except FailedPreconditionError as exc:
            log.warning("refused a searcher: %s", exc)
            raise
        return registered

    async def check_store(self) -> None:
        """Returns once the store has answered a read; UnavailableError while it cannot."""
        await self.store.latest_weights()


def store_chunks(
    trajectories: Sequence[Trajectory], request_id: str, chunk_size: int
) -> list[tuple[str, Sequence[Trajectory]]]:
    """One add's store writes, (request id, trajectories) each: chunks of at most `chunk_size`
    (0: one write). One chunk keeps the caller's id. Otherwise each chunk's id is the caller's
    with its place and size after a space (which no caller's id holds), so a retry stores only
    the chunks not stored yet, and a retry chunked otherwise (the setting changed in between)
    stores its chunks again rather than skip any it never stored."""
    size = chunk_size or len(trajectories)
    if len(trajectories) <= size:
        return [(request_id, trajectories)]
    starts = range(0, len(trajectories), size)
    chunks = [trajectories[start : start + size] for start in starts]
    return [
        (f"{request_id} {start}+{len(chunk)}", chunk)
        for start, chunk in zip(starts, chunks, strict=True)
    ]


def growth_freeze_due(trainer_step: int, freeze_after_step: int) -> bool:
    """Whether the trainer's reported step has reached `freeze_after_step` (0: never)."""
    return 0 < freeze_after_step <= trainer_step
