"""The sampling maths of DESIGN.md section 2, pure and seeded.

A batch is B prompt groups. Each group is drawn, with probability m, by *recency* (a prompt
among the most recently updated ones, and its K newest completions) and otherwise by *reward
priority* (any prompt, and K of its completions drawn without replacement with probability
softmax(reward / tau); tau = inf is uniform).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

from tba.buffer.store import Candidate
from tba.domain import SampleSource


def plan_sources(
    num_prompts: int, recency_probability: float, rng: np.random.Generator
) -> list[SampleSource]:
    """One independent Bernoulli(m) draw per group."""
    draws = rng.random(num_prompts) < recency_probability
    return [SampleSource.RECENCY if d else SampleSource.REWARD for d in draws]


def pick_distinct(
    pool: Sequence[str], count: int, exclude: Iterable[str], rng: np.random.Generator
) -> list[str]:
    """Up to `count` distinct members of `pool` not in `exclude`, uniformly without
    replacement."""
    excluded = set(exclude)
    eligible = list(dict.fromkeys(p for p in pool if p not in excluded))
    if count >= len(eligible):
        order = rng.permutation(len(eligible))
    else:
        order = rng.choice(len(eligible), size=count, replace=False)
    return [eligible[i] for i in order]


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
