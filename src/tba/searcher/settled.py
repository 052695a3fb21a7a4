"""Passing over settled prompts: a searcher-side curriculum.

A prompt group whose completions all got the same reward teaches TB and RLOO nothing about the
reward (the per-group log Z or baseline cancels what they share), and once a policy is
halfway most groups settle: sampled at a hard-1 checkpoint with held-out accuracy 0.69, two
in three groups of 8 were all right or all wrong (docs/benchmarks.md). A searcher that
remembers the prompts whose last group settled passes over each at its next `passes` leases,
and spends its generation on the others.

The searcher leases `prompts_per_round * (1 + passes)` prompts and generates for the first
`prompts_per_round` not passed over; the lease's other prompts go back to the pool when the
round's post acknowledges it. That many are always enough in the steady state: each settled
group costs at most `passes` later leases. When a lease still holds too few, the prompts
passed over fill the round in lease order, so a round never shrinks.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence

from tba.domain import Prompt

# Remembered prompts at most, oldest out first: a bound for prompt sets of millions.
MAX_REMEMBERED = 1_000_000


class SettledPrompts:
    """Prompts to pass over and how many more leases each is passed over at. Thread-safe: the
    finish stage records while the loop chooses."""

    def __init__(self, passes: int, max_remembered: int = MAX_REMEMBERED) -> None:
        if passes < 1:
            raise ValueError(f"passes must be at least 1, got {passes}")
        self.passes = passes
        self._max_remembered = max_remembered
        self._left: OrderedDict[str, int] = OrderedDict()
        self._lock = threading.Lock()

    def lease_size(self, prompts_per_round: int) -> int:
        """Prompts to lease for a round of `prompts_per_round`."""
        return prompts_per_round * (1 + self.passes)

    def choose(self, prompts: Sequence[Prompt], wanted: int) -> tuple[list[Prompt], int]:
        """The first `wanted` of `prompts` not passed over, in lease order, topped up with
        passed-over ones when too few; and how many were passed over. Each prompt passed
        over uses up one of its passes."""
        chosen: list[Prompt] = []
        passed: list[Prompt] = []
        with self._lock:
            for prompt in prompts:
                if len(chosen) == wanted:
                    break
                if self._pass_over(prompt.id):
                    passed.append(prompt)
                else:
                    chosen.append(prompt)
        filled = passed[: wanted - len(chosen)]
        return chosen + filled, len(passed) - len(filled)

    def record(self, groups: Iterable[tuple[str, Sequence[float]]]) -> None:
        """Each (prompt id, the rewards of its group's completions) of a round: a group whose
        completions all got the same reward settles its prompt (one left of several, the
        others its duplicates, too); any other makes it count again."""
        with self._lock:
            for prompt_id, rewards in groups:
                self._left.pop(prompt_id, None)
                if rewards and min(rewards) == max(rewards):
                    self._left[prompt_id] = self.passes
            while len(self._left) > self._max_remembered:
                self._left.popitem(last=False)

    def __len__(self) -> int:
        with self._lock:
            return len(self._left)

    def _pass_over(self, prompt_id: str) -> bool:
        left = self._left.get(prompt_id, 0)
        if left <= 0:
            return False
        if left == 1:
            del self._left[prompt_id]
        else:
            self._left[prompt_id] = left - 1
        return True
