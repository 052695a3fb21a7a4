"""What a task is: prompts in named splits, a reward, and stable prompt ids.

A reward reads only the prompt (its `answer` carries the gold) and the completion text, so a
searcher can score prompts that people submitted to the buffer as well as the task's own.
"""

from __future__ import annotations

import enum
import hashlib
from typing import Protocol

from tba.domain import Prompt


class Split(enum.StrEnum):
    TRAIN = "train"
    TEST = "test"


class Task(Protocol):
    @property
    def name(self) -> str: ...

    def prompts(self, split: Split) -> list[Prompt]:
        """Every prompt of `split` in a fixed order, with ids from `prompt_id`."""
        ...

    def reward(self, prompt: Prompt, completion_text: str) -> float:
        """A finite score; never raises, whatever the text."""
        ...


def prompt_id(task: str, text: str, answer: str) -> str:
    """An id that depends only on the content, so every searcher seeding the same prompts
    names them alike and PutPrompts stays idempotent across replicas and restarts."""
    digest = hashlib.sha256(f"{text}\0{answer}".encode()).hexdigest()[:20]
    return f"{task}-{digest}"


def make_prompt(task: str, text: str, answer: str) -> Prompt:
    return Prompt(id=prompt_id(task, text, answer), text=text, answer=answer)
