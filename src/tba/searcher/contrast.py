"""Posting K of the S completions generated per prompt, chosen for contrast.

With sparse rewards a prompt the policy rarely gets right yields a right answer in few groups
of K: at 8% per sample, 8 samples hold one in 49% of groups, 16 in 74%. TB and RLOO learn
only from the contrast within a group (the per-group log Z or baseline cancels what the
completions share), so a searcher that generates S > K and posts the K that spread the
rewards most turns more of its search into a signal, at the cost of generating more and
scoring the reference of only the K posted. TB's target does not depend on which
completions are trained on, so choosing them changes how fast it is reached, not where; the
on-policy objectives (RLOO, GRPO) assume the group was sampled as it stands, and the choice
biases their gradient.

The K are taken alternately from the top and the bottom of the group's reward ranking
(generation order among equal rewards, which is random): with 0/1 rewards, right and wrong
in turn until one kind runs out, then the other kind.
"""

from __future__ import annotations

from collections.abc import Sequence


def contrast_selection(rewards: Sequence[float], keep: int) -> list[int]:
    """Indices of the `keep` of `rewards` (one prompt's group, in generation order) to post,
    ascending; all of them when there are no more than `keep`."""
    if keep < 1:
        raise ValueError(f"keep must be at least 1, got {keep}")
    if len(rewards) <= keep:
        return list(range(len(rewards)))
    # sorted() is stable: equal rewards keep their (random) generation order.
    ranked = sorted(range(len(rewards)), key=lambda i: rewards[i], reverse=True)
    # Top and bottom in turn, top first: the first ceil(keep / 2) and the last floor(keep / 2).
    from_top = (keep + 1) // 2
    return sorted(ranked[:from_top] + ranked[len(ranked) - (keep - from_top) :])
