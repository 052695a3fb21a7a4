"""Evaluation of a completion function on a task's prompts: one completion per prompt, scored
by the task's reward. Generation is injected, so this knows no engine (torch, vLLM, HTTP)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tba.domain import Prompt
from tba.errors import InvalidArgumentError
from tba.tasks.base import Task

Complete = Callable[[list[Prompt]], list[str]]


@dataclass(frozen=True, slots=True)
class PromptResult:
    prompt: Prompt
    completion_text: str
    reward: float


@dataclass(frozen=True, slots=True)
class EvalResult:
    task: str
    results: list[PromptResult]

    @property
    def count(self) -> int:
        return len(self.results)

    @property
    def accuracy(self) -> float:
        """Mean reward: pass@1 for 0/1 rewards with one completion per prompt."""
        return math.fsum(r.reward for r in self.results) / self.count

    def metrics(self) -> dict[str, float]:
        return {"eval/accuracy": self.accuracy, "eval/count": float(self.count)}


def evaluate(task: Task, prompts: Sequence[Prompt], complete: Complete) -> EvalResult:
    """Complete every prompt once with `complete` and score each completion with `task`."""
    if not prompts:
        raise InvalidArgumentError("no prompts to evaluate")
    batch = list(prompts)
    completions = complete(batch)
    if len(completions) != len(batch):
        raise InvalidArgumentError(
            f"the completion function returned {len(completions)} completions "
            f"for {len(batch)} prompts"
        )
    results = [
        PromptResult(prompt, text, task.reward(prompt, text))
        for prompt, text in zip(batch, completions, strict=True)
    ]
    return EvalResult(task=task.name, results=results)
