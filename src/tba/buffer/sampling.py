"""The sampling maths of DESIGN.md section 2, pure and seeded.

A batch is B prompt groups. Each group is drawn, with probability m, by *recency* (a prompt
among those with completions of the newest policy versions, and its K newest completions)
and otherwise by *reward priority* (any prompt, and K of its completions drawn without
replacement with probability softmax(reward / tau); tau = inf is uniform).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

from tba.buffer.store import Candidate, PromptDraw
from tba.domain import SampleSource

# Reward-side uniforms per reward group beyond a few spare: repeats and excluded prompts are
# skipped, so spare draws avoid another round trip.
_OVERSAMPLE = 2


def plan_sources(
    num_prompts: int, recency_probability: float, rng: np.random.Generator
) -> list[SampleSource]:
    """One independent Bernoulli(m) draw per group."""
    draws = rng.random(num_prompts) < recency_probability
    return [SampleSource.RECENCY if d else SampleSource.REWARD for d in draws]


def prompt_draw(
    sources: Sequence[SampleSource],
    window: int,
    exclude: Iterable[str],
    rng: np.random.Generator,
    *,
    recent_candidates: int = 0,
    max_age_versions: int | None = None,
    min_version: int | None = None,
) -> PromptDraw:
    """What a store needs to choose prompts for `sources`: a uniform per group for the
    recency side (which takes the reward side's slots it cannot fill) and spare ones for the
    reward side, whose draws may repeat prompts or hit excluded ones; and which of their
    candidates to read (`PromptDraw`): what `select_completions` can take of them, not a
    prompt's whole history (up to `prompt_history`)."""
    wanted_reward = sum(s is SampleSource.REWARD for s in sources)
    return PromptDraw(
        window=window,
        wanted_recent=len(sources) - wanted_reward,
        recent_uniforms=tuple(rng.random(len(sources)).tolist()),
        reward_uniforms=tuple(rng.random(_OVERSAMPLE * wanted_reward + 4).tolist()),
        exclude=frozenset(exclude),
        recent_candidates=recent_candidates,
        max_age_versions=max_age_versions,
        min_version=min_version,
    )


def candidate_floor(draw: PromptDraw, latest_version: int) -> int:
    """The oldest policy version whose candidates a round reads."""
    if draw.min_version is not None:
        return draw.min_version
    return min_version_allowed(latest_version, draw.max_age_versions)


def usable_candidates(
    newest_first: Iterable[Candidate], source: SampleSource, draw: PromptDraw, floor: int
) -> list[Candidate]:
    """A chosen prompt's candidates the round reads, oldest first, from its stored ones
    newest first: those of version `floor` or newer, and for the recency side only the newest
    `recent_candidates` of them (0: all), which are the ones `select_completions` takes.
    lua/draw_prompts.lua reads the same."""
    limit = draw.recent_candidates if source is SampleSource.RECENCY else 0
    usable = []
    for candidate in newest_first:
        if candidate.policy_version >= floor:
            usable.append(candidate)
            if len(usable) == limit:
                break
    usable.reverse()
    return usable


def choose_prompts(
    window: Sequence[str], ranked: Sequence[str], draw: PromptDraw
) -> dict[str, SampleSource]:
    """Distinct prompts for a draw, none excluded, given the `window` (by newest policy
    version, then newest trajectory) and the prompts with trajectories by rank. Recency: a
    uniform pick without replacement from the window; reward: the prompt at rank
    floor(u * n) for each reward uniform in turn, repeats skipped; slots the reward side
    leaves go to the window.
    lua/draw_prompts.lua computes the same choice in Redis."""
    eligible = [p for p in dict.fromkeys(window) if p not in draw.exclude]
    recent = uniform_prefix(eligible, draw.recent_uniforms[: draw.wanted_recent])
    taken = set(draw.exclude) | set(recent)
    reward: list[str] = []
    wanted_reward = len(draw.recent_uniforms) - draw.wanted_recent
    for u in draw.reward_uniforms:
        if len(reward) >= wanted_reward or not ranked:
            break
        prompt_id = ranked[rank_of(u, len(ranked))]
        if prompt_id not in taken:
            reward.append(prompt_id)
            taken.add(prompt_id)
    spare = draw.recent_uniforms[draw.wanted_recent :][: wanted_reward - len(reward)]
    recent += uniform_prefix([p for p in eligible if p not in taken], spare)
    chosen = dict.fromkeys(recent, SampleSource.RECENCY)
    chosen.update(dict.fromkeys(reward, SampleSource.REWARD))
    return chosen


def uniform_prefix(items: Sequence[str], uniforms: Sequence[float]) -> list[str]:
    """The first len(uniforms) items of a Fisher-Yates shuffle driven by `uniforms` (fewer
    when `items` runs out): a uniform draw without replacement. All zeros keep the order."""
    shuffled = list(items)
    for i, u in enumerate(uniforms[: len(shuffled)]):
        j = i + rank_of(u, len(shuffled) - i)
        shuffled[i], shuffled[j] = shuffled[j], shuffled[i]
    return shuffled[: len(uniforms)]


def rank_of(u: float, n: int) -> int:
    """floor(u * n) for u in [0, 1), kept within [0, n - 1]."""
    return min(max(math.floor(u * n), 0), n - 1)


def min_version_allowed(latest_version: int, max_age_versions: int | None) -> int:
    """Oldest policy version a sample may come from under the age cut."""
    if max_age_versions is None:
        return 0
    return max(0, latest_version - max_age_versions)


def select_completions(
    candidates: Sequence[Candidate],
    k: int,
    source: SampleSource,
    reward_temperature: float,
    min_version: int,
    rng: np.random.Generator,
) -> list[int]:
    """Trajectory ids of up to k completions of one prompt, in the order drawn."""
    fresh = [c for c in candidates if c.policy_version >= min_version]
    if source is SampleSource.RECENCY:
        newest = sorted(fresh, key=lambda c: c.trajectory_id, reverse=True)
        return [c.trajectory_id for c in newest[:k]]
    return softmax_without_replacement(fresh, k, reward_temperature, rng)


def softmax_without_replacement(
    candidates: Sequence[Candidate], k: int, reward_temperature: float, rng: np.random.Generator
) -> list[int]:
    """Successive draws without replacement, each with probability softmax(reward / tau)
    over those left (Gumbel top-k: argsort of reward / tau + Gumbel noise)."""
    if not candidates:
        return []
    keys = rng.gumbel(size=len(candidates))
    if not math.isinf(reward_temperature):
        keys = keys + np.array([c.reward for c in candidates]) / reward_temperature
    order = np.argsort(-keys, kind="stable")[:k]
    return [candidates[i].trajectory_id for i in order]
