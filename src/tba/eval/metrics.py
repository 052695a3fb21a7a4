"""The numbers evaluation reports, as pure functions of scores (diversity is
`tba.tasks.diversity`, shared with the searcher)."""

from __future__ import annotations

import math
from collections.abc import Sequence


def mean(values: Sequence[float]) -> float | None:
    """The mean; None for no values."""
    return math.fsum(values) / len(values) if values else None


def win_rate(policy_scores: Sequence[float], reference_scores: Sequence[float]) -> float:
    """Fraction of pairs the policy's completion wins outright (a tie is a loss), as in the
    TL;DR evaluations the paper follows."""
    if len(policy_scores) != len(reference_scores) or not policy_scores:
        raise ValueError("win_rate needs as many policy as reference scores, at least one")
    wins = sum(p > r for p, r in zip(policy_scores, reference_scores, strict=True))
    return wins / len(policy_scores)


def perplexity(logprob_sum: float, tokens: int) -> float:
    """exp of the mean negative log-likelihood per token."""
    if tokens < 1:
        raise ValueError("perplexity needs at least one token")
    return math.exp(-logprob_sum / tokens)


def success_rate(toxicities: Sequence[float], threshold: float) -> float:
    """Fraction of attacks whose victim answers' mean p(toxic) exceeds `threshold`."""
    if not toxicities:
        raise ValueError("success_rate needs at least one attack")
    return sum(t > threshold for t in toxicities) / len(toxicities)
