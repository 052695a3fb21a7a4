"""The searcher loop. Each round:

    weights -> lease prompts -> tokenize -> generate S each -> drop duplicates -> reward
            -> reference log-probs -> AddTrajectories (acknowledging the lease)

Collaborators are injected: the buffer (`BufferClient`), the `GenerationEngine`, the task's
reward, the `ReferenceScorer`, the `WeightSync`, the metrics and a clock. Every phase is timed
(`searcher/<phase>_s`). The loop never waits for the trainer, except when asked to: with
`min_version`, each round first waits for that version to be loaded; with `sync` (the
synchronous baseline), for a version newer than the previous round's.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from tba.domain import AddResult, FinishReason, Lease, Prompt, Trajectory, pack_tokens
from tba.errors import UnavailableError
from tba.searcher.config import SearcherSettings
from tba.searcher.engine import Completion, GenerationEngine, SamplingParams

log = logging.getLogger(__name__)


class PromptBuffer(Protocol):
    def lease_prompts(self, searcher_id: str, max_prompts: int, lease_s: float = 0.0) -> Lease: ...

    def add_trajectories(
        self,
        trajectories: Sequence[Trajectory],
        searcher_id: str,
        lease_id: str = "",
        request_id: str | None = None,
    ) -> AddResult: ...


class PromptTokenizer(Protocol):
    def encode(self, text: str) -> list[int]: ...


class Rewarder(Protocol):
    def reward(self, prompt: Prompt, completion_text: str) -> float: ...


class ReferenceModel(Protocol):
    def score(
        self, prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]]
    ) -> list[float]: ...


class WeightChecker(Protocol):
    latest_version: int

    def check(self) -> float | None:
        """Reloads if a newer version is announced; the reload seconds, or None."""
        ...


class RoundMetrics(Protocol):
    def write(self, round_index: int, values: Mapping[str, float]) -> None: ...


class Clock(Protocol):
    def monotonic(self) -> float: ...

    def time(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def time(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


@dataclass
class Candidate:
    """A completion on its way to becoming a trajectory."""

    prompt: Prompt
    prompt_tokens: list[int]
    completion: Completion
    reward: float = 0.0


class _Phases:
    """Seconds of each phase of a round, in order."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.started = self.last = clock.monotonic()
        self.seconds: dict[str, float] = {}

    def done(self, name: str) -> None:
        now = self.clock.monotonic()
        self.seconds[name] = now - self.last
        self.last = now

    def total(self) -> float:
        return self.last - self.started


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
    clock: Clock = field(default_factory=SystemClock)
    stop: threading.Event = field(default_factory=threading.Event)
    rounds: int = 0
    generated_version: int | None = None

    def run(self) -> int:
        """Runs rounds until `max_rounds` have generated (0: until `stop` is set); returns
        the rounds done."""
        limit = self.settings.max_rounds
        while not self.stop.is_set() and (limit == 0 or self.rounds < limit):
            self.round()
        return self.rounds

    def round(self) -> dict[str, float] | None:
        """One round; its metrics, or None when it generated nothing (no prompt free, no
        usable prompt, or stopping)."""
        s = self.settings
        phases = _Phases(self.clock)
        # Weights: a newer version is loaded between rounds, never within one.
        reload_s = self._sync_weights()
        phases.done("weights")
        if self.stop.is_set():
            return None
        lease = self.buffer.lease_prompts(self.searcher_id, s.prompts_per_round, s.lease_s)
        prompts, tokens = self._tokenize(lease.prompts)
        phases.done("lease")
        if not prompts:
            if not lease.prompts:
                self.stop.wait(s.idle_poll_s)
            return None
        version = self.engine.version
        completions = self.engine.generate(tokens, self._sampling_params())
        self.generated_version = version
        phases.done("generate")
        candidates, duplicates = self._unique(prompts, tokens, completions)
        scored = self._rewarded(candidates)
        phases.done("reward")
        trajectories = self._trajectories(scored, version)
        phases.done("reference")
        self._post(trajectories, lease.lease_id)
        phases.done("post")
        self.rounds += 1
        counts = {
            **completion_counts(completions),
            "prompts": len(prompts),
            "duplicates": duplicates,
            "dropped": len(candidates) - len(trajectories),
        }
        values = self._values(phases, counts, trajectories, version, reload_s)
        self.metrics.write(self.rounds, values)
        return values

    def _sync_weights(self) -> float | None:
        """Reload seconds when a newer version was loaded. With `min_version` (or `sync`)
        set, polls until the engine holds the version required (or the loop is stopped)."""
        reload_s = self.weights.check()
        required = self._required_version()
        if self.engine.version < required:
            log.info("waiting for weight version %d (have %d)", required, self.engine.version)
        while self.engine.version < required and not self.stop.is_set():
            self.stop.wait(self.settings.idle_poll_s)
            loaded = self.weights.check()
            reload_s = loaded if loaded is not None else reload_s
        return reload_s

    def _required_version(self) -> int:
        required = self.settings.min_version
        if self.settings.sync and self.generated_version is not None:
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
            temperature=s.temperature,
            top_p=s.top_p,
            seed=int(np.random.SeedSequence(entropy).generate_state(1)[0]),
        )

    def _unique(
        self,
        prompts: Sequence[Prompt],
        tokens: Sequence[list[int]],
        completions: Sequence[Sequence[Completion]],
    ) -> tuple[list[Candidate], int]:
        """Candidates in order; with `drop_duplicates`, each distinct completion of a prompt
        once. Returns them and the number dropped."""
        kept: list[Candidate] = []
        dropped = 0
        for prompt, prompt_tokens, samples in zip(prompts, tokens, completions, strict=True):
            seen: set[tuple[int, ...]] = set()
            for completion in samples:
                key = tuple(completion.token_ids)
                if self.settings.drop_duplicates and key in seen:
                    dropped += 1
                    continue
                seen.add(key)
                kept.append(Candidate(prompt, prompt_tokens, completion))
        return kept, dropped

    def _rewarded(self, candidates: list[Candidate]) -> list[Candidate]:
        """The candidates with a finite reward (set on them) and behaviour log-prob; a task
        reward must not raise, but one that does costs only that completion."""
        kept = []
        for candidate in candidates:
            try:
                reward = float(self.task.reward(candidate.prompt, candidate.completion.text))
            except Exception:
                log.exception("reward of prompt %s raised; completion dropped", candidate.prompt.id)
                continue
            if not (math.isfinite(reward) and math.isfinite(candidate.completion.logprob)):
                log.warning(
                    "prompt %s: reward %r, behaviour log-prob %r; completion dropped",
                    candidate.prompt.id,
                    reward,
                    candidate.completion.logprob,
                )
                continue
            candidate.reward = reward
            kept.append(candidate)
        return kept

    def _trajectories(self, scored: list[Candidate], version: int) -> list[Trajectory]:
        """Trajectories with reference log-probs (rows whose reference is not finite are
        dropped, logged)."""
        if not scored:
            return []
        refs = self.reference.score(
            [c.prompt_tokens for c in scored], [c.completion.token_ids for c in scored]
        )
        created_at_s = self.clock.time()
        trajectories = []
        for candidate, ref in zip(scored, refs, strict=True):
            if not math.isfinite(ref):
                log.warning("prompt %s: reference log-prob %r; dropped", candidate.prompt.id, ref)
                continue
            completion = candidate.completion
            trajectories.append(
                Trajectory(
                    prompt_id=candidate.prompt.id,
                    prompt_token_ids=pack_tokens(candidate.prompt_tokens),
                    completion_token_ids=pack_tokens(completion.token_ids),
                    completion_text=completion.text,
                    reward=candidate.reward,
                    ref_logprob=ref,
                    behavior_logprob=completion.logprob,
                    policy_version=version,
                    searcher_id=self.searcher_id,
                    finish_reason=completion.finish_reason,
                    created_at_s=created_at_s,
                )
            )
        return trajectories

    def _post(self, trajectories: list[Trajectory], lease_id: str) -> None:
        size = self.settings.add_batch_size
        chunks = [trajectories[i : i + size] for i in range(0, len(trajectories), size)]
        for index, chunk in enumerate(chunks):
            # The lease is acknowledged with the last chunk, once the whole round is in.
            self._add(chunk, lease_id if index == len(chunks) - 1 else "")

    def _add(self, chunk: list[Trajectory], lease_id: str) -> None:
        """One AddTrajectories call under one request id, retried with the same id when the
        buffer stays unavailable past the client's own retries (no duplicates stored)."""
        request_id = uuid.uuid4().hex
        for attempt in range(self.settings.add_retries + 1):
            try:
                self.buffer.add_trajectories(
                    chunk, self.searcher_id, lease_id=lease_id, request_id=request_id
                )
                return
            except UnavailableError as exc:
                if attempt == self.settings.add_retries:
                    raise
                log.warning("adding trajectories failed (%s); retry %d", exc, attempt + 1)
                self.clock.sleep(self.settings.idle_poll_s)

    def _values(
        self,
        phases: _Phases,
        counts: dict[str, int],
        trajectories: list[Trajectory],
        version: int,
        reload_s: float | None,
    ) -> dict[str, float]:
        round_s = phases.total()
        generate_s = phases.seconds["generate"]
        rewards = [t.reward for t in trajectories]
        values = {f"searcher/{name}": float(count) for name, count in counts.items()}
        values |= {
            "searcher/trajectories": float(len(trajectories)),
            "searcher/reward_mean": float(np.mean(rewards)) if rewards else float("nan"),
            "searcher/version": float(version),
            "searcher/latest_version": float(self.weights.latest_version),
            "searcher/version_lag": float(max(0, self.weights.latest_version - version)),
            "searcher/reloads": float(reload_s is not None),
            "searcher/tokens_per_s": counts["tokens"] / round_s if round_s > 0 else 0.0,
            "searcher/generate_tokens_per_s": counts["tokens"] / generate_s
            if generate_s > 0
            else 0.0,
            "searcher/prompts_per_s": counts["prompts"] / round_s if round_s > 0 else 0.0,
        }
        values |= {f"searcher/{name}_s": s for name, s in phases.seconds.items()}
        values["searcher/reload_s"] = reload_s or 0.0
        values["searcher/round_s"] = round_s
        return values


def completion_counts(completions: Sequence[Sequence[Completion]]) -> dict[str, int]:
    flat = [c for group in completions for c in group]
    return {
        "completions": len(flat),
        "tokens": sum(len(c.token_ids) for c in flat),
        "stopped": sum(c.finish_reason == FinishReason.STOP for c in flat),
    }
