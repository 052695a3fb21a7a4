"""The searcher loop. Each round:

    weights -> lease prompts -> tokenize -> generate S each
    -> [wait for the previous round's finish] -> hand the round to the finish stage

and the finish stage (tba.searcher.finish: drop duplicates -> reward -> reference log-probs
-> AddTrajectories acknowledging the lease -> metrics) runs on one worker thread while the
next round generates, so the reference forward pass and posting cost no generation time. At
most one round is in flight: the loop waits for round r's finish before handing over round
r+1, which bounds memory and re-raises the worker's errors in the loop. New weights are
swapped in only here, between generations (`WeightSync` downloads and prepares them on its
own thread meanwhile); the worker uses the frozen reference model, never the engine. `run`
returns once every round it generated is posted.

Collaborators are injected: the buffer (`BufferClient`), the `GenerationEngine`, the task's
reward, the `ReferenceScorer`, the `WeightSync`, the metrics and a clock. Every phase is timed
(`searcher/<phase>_s`; `wait_finish_s` is the time the loop waited for the previous finish).
The loop never waits for the trainer or for a download, except when asked to: with
`min_version`, each round first waits for that version to be loaded; with
`one_round_per_version`, for a version newer than the previous round's. The previous round's
finish goes on meanwhile: an asynchronous trainer may publish that version before the round
is posted (it trains on the round before), and the next round then generates while the
previous one is scored and posted.
"""

from __future__ import annotations

import logging
import threading
import zlib
from collections.abc import Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from tba.clock import Clock, SystemClock
from tba.domain import Lease, Prompt
from tba.searcher.config import SearcherSettings
from tba.searcher.engine import GenerationEngine, SamplingParams
from tba.searcher.finish import (
    GeneratedRound,
    Phases,
    ReferenceModel,
    RoundFinisher,
    RoundMetrics,
    TrajectorySink,
)
from tba.searcher.settled import SettledPrompts
from tba.searcher.weights import WeightSwap
from tba.tasks.base import Rewarder

log = logging.getLogger(__name__)
# Appended to a round's seed entropy for the stream its temperature is drawn from.
_TEMPERATURE_STREAM = 1


class PromptBuffer(TrajectorySink, Protocol):
    def lease_prompts(self, searcher_id: str, max_prompts: int, lease_s: float = 0.0) -> Lease: ...


class PromptTokenizer(Protocol):
    def encode(self, text: str) -> list[int]: ...


class WeightChecker(Protocol):
    latest_version: int

    def check(self) -> WeightSwap | None:
        """Swaps in a newer version if one is ready (its swap, or None), and starts
        fetching the newest announced one in the background; never waits for a download."""
        ...

    def wait_fetch(self, timeout_s: float | None) -> bool:
        """Waits up to `timeout_s` for the fetch in flight; whether there was one."""
        ...

    def wait_announce(self, timeout_s: float) -> bool:
        """With no fetch in flight, waits up to `timeout_s` for a newer version to be
        announced and starts fetching it; whether one was."""
        ...


@dataclass
class SearcherLoop:
    settings: SearcherSettings
    searcher_id: str
    buffer: PromptBuffer
    engine: GenerationEngine
    tokenizer: PromptTokenizer
    task: Rewarder
    reference: ReferenceModel
    weights: WeightChecker
    metrics: RoundMetrics
    # With `settled_prompt_passes`, what the rounds found settled (tba.searcher.settled).
    settled: SettledPrompts | None = None
    clock: Clock = field(default_factory=SystemClock)
    stop: threading.Event = field(default_factory=threading.Event)
    rounds: int = 0
    generated_version: int | None = None
    _in_flight: Future[dict[str, float]] | None = field(default=None, init=False, repr=False)

    def run(self) -> int:
        """Runs rounds until `max_rounds` have generated (0: until `stop` is set), each
        round's finish overlapping the next round's generation; returns the rounds done once
        all of them are posted."""
        limit = self.settings.max_rounds
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="searcher-finish") as worker:
            try:
                while not self.stop.is_set() and (limit == 0 or self.rounds < limit):
                    self._pipelined_round(worker)
            finally:
                # Nothing generated is lost: stopping, the last round or an error in the
                # loop still posts the round in flight.
                self._wait_finish()
        return self.rounds

    def round(self) -> dict[str, float] | None:
        """One whole round, its finish included, in the calling thread; its metrics, or None
        when it generated nothing (no prompt free, no usable prompt, or stopping)."""
        generated = self._generate()
        return None if generated is None else self._finisher().finish(generated)

    def _pipelined_round(self, worker: Executor) -> None:
        generated = self._generate()
        if generated is not None:
            self._in_flight = worker.submit(self._finisher().finish, generated)

    def _finisher(self) -> RoundFinisher:
        return RoundFinisher(
            self.settings,
            self.searcher_id,
            self.buffer,
            self.task,
            self.reference,
            self.metrics,
            self.clock,
            self.settled,
        )

    def _wait_finish(self) -> None:
        """Blocks until the round in flight is posted; its error, if any, is raised here."""
        in_flight, self._in_flight = self._in_flight, None
        if in_flight is not None:
            in_flight.result()

    def _generate(self) -> GeneratedRound | None:
        """A round up to its hand-over; None when it generated nothing."""
        phases = Phases(self.clock)
        # Weights: a newer version is swapped in between generations, never within one.
        swaps = self._sync_weights()
        phases.done("weights")
        if self.stop.is_set():
            return None
        lease_id, prompts, tokens, passed_over = self._lease()
        phases.done("lease")
        if not prompts:
            return None
        policy_version = self.engine.version
        params = self._sampling_params()
        completions = self.engine.generate(tokens, params)
        self.generated_version = policy_version
        phases.done("generate")
        # At most one round in flight: memory stays bounded, and its errors surface here.
        self._wait_finish()
        phases.done("wait_finish")
        self.rounds += 1
        return GeneratedRound(
            index=self.rounds,
            lease_id=lease_id,
            prompts=prompts,
            prompt_tokens=tokens,
            completions=completions,
            policy_version=policy_version,
            latest_version=self.weights.latest_version,
            swaps=swaps,
            loop_seconds=phases.seconds,
            temperature=params.temperature,
            passed_over=passed_over,
        )

    def _lease(self) -> tuple[str, list[Prompt], list[list[int]], int]:
        """A lease, the usable prompts to generate for with their tokens, and how many were
        passed over as settled; when no prompt was free, after waiting `idle_poll_s`."""
        s, settled = self.settings, self.settled
        wanted = s.prompts_per_round
        size = wanted if settled is None else settled.lease_size(wanted)
        lease = self.buffer.lease_prompts(self.searcher_id, size, s.lease_s)
        if not lease.prompts:
            self.stop.wait(s.idle_poll_s)
        if settled is None:
            return (lease.lease_id, *self._tokenize(lease.prompts), 0)
        # The prompts not chosen go back to the pool when the round's post acknowledges the
        # lease.
        prompts, passed_over = settled.choose(lease.prompts, wanted)
        return (lease.lease_id, *self._tokenize(prompts), passed_over)

    def _sync_weights(self) -> tuple[WeightSwap, ...]:
        """The versions swapped in. With `min_version` (or `one_round_per_version`) set,
        waits until the engine holds the version required (or the loop is stopped)."""
        swaps = [self.weights.check()]
        required = self._required_version()
        if self.engine.version < required:
            log.info("waiting for weight version %d (have %d)", required, self.engine.version)
        while self.engine.version < required and not self.stop.is_set():
            # A fetch in flight ends the wait once it is ready; with none, the buffer answers
            # when the next version is announced (an older buffer at once: then poll).
            if not self.weights.wait_fetch(self.settings.idle_poll_s) and not self._announced():
                self.stop.wait(self.settings.idle_poll_s)
            swaps.append(self.weights.check())
        return tuple(swap for swap in swaps if swap is not None)

    def _announced(self) -> bool:
        wait_s = self.settings.announce_wait_s
        return wait_s > 0 and self.weights.wait_announce(wait_s)

    def _required_version(self) -> int:
        required = self.settings.min_version
        if self.settings.one_round_per_version and self.generated_version is not None:
            required = max(required, self.generated_version + 1)
        return required

    def _tokenize(self, prompts: Sequence[Prompt]) -> tuple[list[Prompt], list[list[int]]]:
        kept: list[Prompt] = []
        tokens: list[list[int]] = []
        limit = self.settings.max_prompt_tokens
        for prompt in prompts:
            ids = list(self.tokenizer.encode(prompt.text))
            if not ids or (limit is not None and len(ids) > limit):
                log.warning("skipping prompt %s: %d tokens", prompt.id, len(ids))
                continue
            kept.append(prompt)
            tokens.append(ids)
        return kept, tokens

    def _sampling_params(self) -> SamplingParams:
        # Seeded by (run seed, searcher, round): replicas sharing a seed still draw apart.
        entropy = [self.settings.seed, zlib.crc32(self.searcher_id.encode()), self.rounds]
        s = self.settings
        return SamplingParams(
            n=s.samples_per_prompt,
            max_new_tokens=s.max_new_tokens,
            temperature=round_temperature(s, entropy),
            top_p=s.top_p,
            seed=int(np.random.SeedSequence(entropy).generate_state(1)[0]),
        )


def round_temperature(settings: SearcherSettings, entropy: Sequence[int]) -> float:
    """The round's sampling temperature: with a range (`temperature_low`..`temperature_high`),
    a `temperature_draw_fraction` of rounds draw one uniformly from it, as Lee et al.'s
    `simulate_experience` does (GFNOrg/red-teaming, trainers/gfn_trainer.py); the others, and
    every round without a range, sample at `temperature`. Drawn from its own stream of the
    round's seed (`entropy`), so it is reproducible and leaves the sampling seed as it was."""
    bounds = settings.temperature_range
    if bounds is None:
        return settings.temperature
    low, high, fraction = bounds
    rng = np.random.default_rng(np.random.SeedSequence([*entropy, _TEMPERATURE_STREAM]))
    draws, temperature = rng.random(), float(rng.uniform(low, high))
    return temperature if draws < fraction else settings.temperature
