"""The finish stage of a searcher round: what happens to a round's completions once they are
generated.

    drop duplicates -> reward -> reference log-probs -> AddTrajectories (acknowledging the
    lease) -> diversity -> round metrics

`SearcherLoop.run` runs it on one worker thread while the next round generates. It touches
none of the loop's generation state (engine, weights, tokenizer): only the frozen reference
model, the task's reward, the buffer and the metrics. Its phases are timed
(`searcher/<phase>_s`) beside the loop's own, which arrive in the `GeneratedRound`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from tba.clock import Clock
from tba.domain import AddResult, FinishReason, Prompt, Trajectory, new_request_id, pack_tokens
from tba.errors import UnavailableError
from tba.retry import Backoff, retry
from tba.searcher.config import SearcherSettings
from tba.searcher.contrast import contrast_selection
from tba.searcher.engine import Completion
from tba.searcher.settled import SettledPrompts
from tba.searcher.weights import WeightSwap
from tba.tasks.base import Rewarder, batch_rewards
from tba.tasks.diversity import final_answer, group_diversity, mean_diversity

log = logging.getLogger(__name__)


class TrajectorySink(Protocol):
    def add_trajectories(
        self,
        trajectories: Sequence[Trajectory],
        *,
        searcher_id: str,
        request_id: str,
        lease_id: str = "",
    ) -> AddResult: ...


@dataclass(frozen=True)
class ReferenceLogprobs:
    """log pi_ref of one completion: the sequence sum and the per-token values it adds,
    packed float32 (`tba.domain.pack_logprobs`); `looked_up` when it was found, scored in an
    earlier call, instead of scored again."""

    logprob: float
    token_logprobs: bytes
    looked_up: bool = False


class ReferenceModel(Protocol):
    def score(
        self,
        prompts: Sequence[Sequence[int]],
        completions: Sequence[Sequence[int]],
        temperature: float,
    ) -> list[ReferenceLogprobs]: ...


class RoundMetrics(Protocol):
    def write(self, round_index: int, values: Mapping[str, float]) -> None: ...


class Phases:
    """Seconds of each phase, in order; a phase marked twice adds up."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.started = self.last = clock.monotonic()
        self.seconds: dict[str, float] = {}

    def done(self, name: str) -> None:
        now = self.clock.monotonic()
        self.seconds[name] = self.seconds.get(name, 0.0) + now - self.last
        self.last = now

    def total(self) -> float:
        return self.last - self.started


@dataclass(frozen=True, kw_only=True)
class GeneratedRound:
    """What the loop hands to the finish stage: a round's completions and how they came.
    `policy_version` is the weight version that generated them, `latest_version` the newest
    the buffer had announced, `swaps` the versions swapped in before they were generated,
    `temperature` the one they were sampled at (the run's, or one the round drew),
    `passed_over` the leased prompts it did not generate for, as settled."""

    index: int
    lease_id: str
    prompts: list[Prompt]
    prompt_tokens: list[list[int]]
    completions: list[list[Completion]]
    policy_version: int
    latest_version: int
    swaps: tuple[WeightSwap, ...]
    loop_seconds: dict[str, float]
    temperature: float
    passed_over: int = 0


@dataclass
class PendingTrajectory:
    """A completion on its way to becoming a trajectory."""

    prompt: Prompt
    prompt_tokens: list[int]
    completion: Completion
    reward: float = 0.0


@dataclass
class RoundFinisher:
    settings: SearcherSettings
    searcher_id: str
    buffer: TrajectorySink
    task: Rewarder
    reference: ReferenceModel
    metrics: RoundMetrics
    clock: Clock
    settled: SettledPrompts | None = None

    def finish(self, generated: GeneratedRound) -> dict[str, float]:
        """Posts the round's trajectories, acknowledging its lease; writes and returns its
        metrics."""
        phases = Phases(self.clock)
        candidates, duplicates = self._unique(generated)
        scored = self._rewarded(candidates)
        if self.settled is not None:
            self.settled.record(group_rewards(scored))
        posted = self._chosen(scored)
        phases.done("reward")
        refs = self._references(posted, generated.temperature)
        trajectories = self._trajectories(posted, refs, generated)
        phases.done("reference")
        self._post(trajectories, generated.lease_id)
        phases.done("post")
        diversity = diversity_values(self.task, generated.completions)
        phases.done("diversity")
        counts = {
            **completion_counts(generated.completions),
            "prompts": len(generated.prompts),
            "duplicates": duplicates,
            # Non-finite rewards, then non-finite references; the unchosen apart.
            "dropped": (len(candidates) - len(scored)) + (len(posted) - len(trajectories)),
            "not_chosen": len(scored) - len(posted),
            "reference_looked_up": sum(ref.looked_up for ref in refs),
            "passed_over": generated.passed_over,
        }
        values = round_values(generated, phases.seconds, counts, trajectories) | diversity
        self.metrics.write(generated.index, values)
        return values

    def _unique(self, generated: GeneratedRound) -> tuple[list[PendingTrajectory], int]:
        """Candidates in order; with `drop_duplicates`, each distinct completion of a prompt
        once. Returns them and the number dropped."""
        kept: list[PendingTrajectory] = []
        dropped = 0
        for prompt, prompt_tokens, samples in zip(
            generated.prompts, generated.prompt_tokens, generated.completions, strict=True
        ):
            seen: set[tuple[int, ...]] = set()
            for completion in samples:
                key = tuple(completion.token_ids)
                if self.settings.drop_duplicates and key in seen:
                    dropped += 1
                    continue
                seen.add(key)
                kept.append(PendingTrajectory(prompt, prompt_tokens, completion))
        return kept, dropped

    def _rewarded(self, candidates: list[PendingTrajectory]) -> list[PendingTrajectory]:
        """The candidates with a finite reward (set on them) and behaviour log-prob. Rewards
        come in one batch (model-based tasks score many per forward pass); a task reward must
        not raise, but if the batch does, each completion is scored alone and one that raises
        costs only itself."""
        kept = []
        for candidate, reward in zip(candidates, self._rewards(candidates), strict=True):
            if not (math.isfinite(reward) and math.isfinite(candidate.completion.behavior_logprob)):
                log.warning(
                    "prompt %s: reward %r, behaviour log-prob %r; completion dropped",
                    candidate.prompt.id,
                    reward,
                    candidate.completion.behavior_logprob,
                )
                continue
            candidate.reward = reward
            kept.append(candidate)
        return kept

    def _rewards(self, candidates: list[PendingTrajectory]) -> list[float]:
        try:
            return batch_rewards(
                self.task,
                [c.prompt for c in candidates],
                [c.completion.text for c in candidates],
                [c.completion.finish_reason != FinishReason.LENGTH for c in candidates],
            )
        except Exception:
            log.exception(
                "batched rewards raised; scoring the %d completions one by one", len(candidates)
            )
        return [self._reward_alone(c) for c in candidates]

    def _reward_alone(self, candidate: PendingTrajectory) -> float:
        try:
            return float(self.task.reward(candidate.prompt, candidate.completion.text))
        except Exception:
            log.exception("reward of prompt %s raised; completion dropped", candidate.prompt.id)
            return math.nan

    def _chosen(self, scored: list[PendingTrajectory]) -> list[PendingTrajectory]:
        """With `post_per_prompt`, the candidates of each prompt chosen for contrast
        (tba.searcher.contrast), prompts in order; else all of them."""
        keep = self.settings.post_per_prompt
        if keep == 0:
            return scored
        return [
            group[i]
            for group in prompt_groups(scored).values()
            for i in contrast_selection([c.reward for c in group], keep)
        ]

    def _references(
        self, scored: list[PendingTrajectory], temperature: float
    ) -> list[ReferenceLogprobs]:
        """Reference log-probs of each candidate at the round's temperature."""
        if not scored:
            return []
        return self.reference.score(
            [c.prompt_tokens for c in scored],
            [c.completion.token_ids for c in scored],
            temperature,
        )

    def _trajectories(
        self,
        scored: list[PendingTrajectory],
        refs: list[ReferenceLogprobs],
        generated: GeneratedRound,
    ) -> list[Trajectory]:
        """Trajectories with their reference log-probs (rows whose reference is not finite
        are dropped, logged), and per-token log-probs with `token_logprobs`. A round at the
        run's temperature leaves the trajectories' own at 0 (the run's), so that they are
        stored as before the per-round range."""
        created_at_s = self.clock.time()
        per_token = self.settings.token_logprobs
        own = generated.temperature
        sampling_temperature = 0.0 if own == self.settings.temperature else own
        trajectories = []
        for candidate, ref in zip(scored, refs, strict=True):
            if not math.isfinite(ref.logprob):
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
                    ref_logprob=ref.logprob,
                    behavior_logprob=completion.behavior_logprob,
                    policy_version=generated.policy_version,
                    finish_reason=completion.finish_reason,
                    created_at_s=created_at_s,
                    behavior_token_logprobs=completion.token_logprobs if per_token else b"",
                    ref_token_logprobs=ref.token_logprobs if per_token else b"",
                    sampling_temperature=sampling_temperature,
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
        request_id = new_request_id()
        wait_s = self.settings.idle_poll_s
        retry(
            lambda: self.buffer.add_trajectories(
                chunk, searcher_id=self.searcher_id, request_id=request_id, lease_id=lease_id
            ),
            Backoff(retries=self.settings.add_retries, first_s=wait_s, max_s=wait_s),
            retry_on=lambda exc: isinstance(exc, UnavailableError),
            on_retry=_log_add_retry,
            sleep=self.clock.sleep,
        )


def prompt_groups(
    scored: Sequence[PendingTrajectory],
) -> dict[str, list[PendingTrajectory]]:
    """Prompt id -> its candidates, prompts and candidates in order."""
    groups: dict[str, list[PendingTrajectory]] = {}
    for candidate in scored:
        groups.setdefault(candidate.prompt.id, []).append(candidate)
    return groups


def group_rewards(scored: Sequence[PendingTrajectory]) -> list[tuple[str, list[float]]]:
    """(prompt id, the rewards of its scored completions) of each prompt, in order."""
    return [(pid, [c.reward for c in group]) for pid, group in prompt_groups(scored).items()]


def _log_add_retry(exc: Exception, number: int, wait_s: float) -> None:
    log.warning("adding trajectories failed (%s); retry %d", exc, number)


def round_values(
    generated: GeneratedRound,
    finish_seconds: dict[str, float],
    counts: dict[str, int],
    trajectories: list[Trajectory],
) -> dict[str, float]:
    """A round's metrics. `round_s` is the loop's own time for the round (waiting for the
    previous finish, weights, lease, generation): while rounds overlap, the time between two
    hand-overs, so `tokens_per_s` is the searcher's throughput."""
    round_s = sum(generated.loop_seconds.values())
    generate_s = generated.loop_seconds["generate"]
    rewards = [t.reward for t in trajectories]
    lag = max(0, generated.latest_version - generated.policy_version)
    values = {f"searcher/{name}": float(count) for name, count in counts.items()}
    values |= {
        "searcher/trajectories": float(len(trajectories)),
        "searcher/reward_mean": float(np.mean(rewards)) if rewards else float("nan"),
        "searcher/version": float(generated.policy_version),
        "searcher/temperature": generated.temperature,
        "searcher/latest_version": float(generated.latest_version),
        "searcher/version_lag": float(lag),
        "searcher/reloads": float(len(generated.swaps)),
        "searcher/tokens_per_s": counts["tokens"] / round_s if round_s > 0 else 0.0,
        "searcher/generate_tokens_per_s": counts["tokens"] / generate_s if generate_s > 0 else 0.0,
        "searcher/prompts_per_s": counts["prompts"] / round_s if round_s > 0 else 0.0,
    }
    seconds = generated.loop_seconds | finish_seconds
    values |= {f"searcher/{name}_s": s for name, s in seconds.items()}
    values |= swap_values(generated.swaps)
    values["searcher/round_s"] = round_s
    return values


def diversity_values(
    task: Rewarder, completions: Sequence[Sequence[Completion]]
) -> dict[str, float]:
    """`distinct_answer_ratio` and `pairwise_distance` of every completion generated (before
    duplicates are dropped: they are part of what the policy drew), mean over the round's
    prompts; NaN when no prompt had two. All from one weight version, `searcher/version`.
    Distances are of token bigrams: no task embeds completions for its reward, and embedding
    them only to measure would cost a model pass per round."""
    groups = (
        group_diversity([final_answer(task, c.text) for c in group], [c.token_ids for c in group])
        for group in completions
    )
    mean = mean_diversity(groups)
    return {
        "searcher/distinct_answer_ratio": _or_nan(mean.distinct_answer_ratio),
        "searcher/pairwise_distance": _or_nan(mean.pairwise_distance),
    }


def _or_nan(value: float | None) -> float:
    return math.nan if value is None else value


def swap_values(swaps: Sequence[WeightSwap]) -> dict[str, float]:
    """`swap_s`: seconds generation paused for new weights (between rounds); `fetch_s`: their
    download, verification and preparation, beside generation; `reload_s`: from seeing the
    last version announced to generating with it. 0 in rounds without a new version."""
    return {
        "searcher/swap_s": sum(s.swap_s for s in swaps),
        "searcher/fetch_s": sum(s.fetch_s for s in swaps),
        "searcher/reload_s": swaps[-1].reload_s if swaps else 0.0,
    }


def completion_counts(completions: Sequence[Sequence[Completion]]) -> dict[str, int]:
    flat = [c for group in completions for c in group]
    return {
        "completions": len(flat),
        "tokens": sum(len(c.token_ids) for c in flat),
        "stopped": sum(c.finish_reason == FinishReason.STOP for c in flat),
    }
