"""`arithmetic`: 2-digit addition (`12+35=` -> `47`), small enough for the tiny char-level
model, with a held-out split drawn from the same pairs by a seeded partition."""

from __future__ import annotations

import random

from tba.domain import Prompt
from tba.tasks.base import Split, make_prompt
from tba.tasks.config import ArithmeticSettings

NAME = "arithmetic"


class ArithmeticTask:
    def __init__(self, settings: ArithmeticSettings | None = None) -> None:
        self.settings = settings or ArithmeticSettings()
        s = self.settings
        operands = range(s.min_operand, s.max_operand + 1)
        pairs = [(a, b) for a in operands for b in operands]
        random.Random(s.seed).shuffle(pairs)
        self._splits = {
            Split.TEST: [_prompt(a, b) for a, b in pairs[: s.test_size]],
            Split.TRAIN: [_prompt(a, b) for a, b in pairs[s.test_size :]],
        }

    @property
    def name(self) -> str:
        return NAME

    def prompts(self, split: Split) -> list[Prompt]:
        return list(self._splits[Split(split)])

    def reward(self, prompt: Prompt, completion_text: str) -> float:
        # Exact match: the model must stop (EOS) right after the sum to score.
        return 1.0 if self.final_answer(completion_text) == prompt.answer else 0.0

    def final_answer(self, completion_text: str) -> str:
        return completion_text.strip()


def _prompt(a: int, b: int) -> Prompt:
    return make_prompt(NAME, f"{a}+{b}=", str(a + b))
