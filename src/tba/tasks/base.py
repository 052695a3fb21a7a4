"""What a task is: prompts in named splits, a reward, and stable prompt ids.

A reward reads only the prompt (its `answer` carries the gold) and the completion text, so a
searcher can score prompts that people submitted to the buffer as well as the task's own.
Tasks whose reward runs a model (a reward model, a victim and a classifier) also score whole
batches at once (`BatchRewarder`); `batch_rewards` calls whichever a task offers. Tasks
whose reward checks a final answer say what it is (`AnswerReader`), so diversity can count
distinct answers (`tba.tasks.diversity`).
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from tba.domain import Prompt
from tba.errors import InvalidArgumentError


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


class Rewarder(Protocol):
    def reward(self, prompt: Prompt, completion_text: str) -> float: ...


@runtime_checkable
class BatchRewarder(Protocol):
    def rewards(
        self,
        prompts: Sequence[Prompt],
        completion_texts: Sequence[str],
        finished: Sequence[bool],
    ) -> list[float]:
        """One finite score per completion, in order. `finished[i]` is False when completion
        i was cut by the length limit (no EOS), which some tasks penalise."""
        ...


@runtime_checkable
class AnswerReader(Protocol):
    def final_answer(self, completion_text: str) -> str | None:
        """The answer the reward checks, written so that equal answers are equal strings;
        None when the text has none. Never raises."""
        ...


def batch_rewards(
    task: Rewarder,
    prompts: Sequence[Prompt],
    completion_texts: Sequence[str],
    finished: Sequence[bool],
) -> list[float]:
    """Rewards of a batch: the task's batched `rewards` when it has one (model-based tasks
    score many completions per forward pass), else its `reward` for each completion."""
    if not len(prompts) == len(completion_texts) == len(finished):
        raise InvalidArgumentError(
            f"{len(prompts)} prompts, {len(completion_texts)} completions and "
            f"{len(finished)} finished flags: they must match"
        )
    if isinstance(task, BatchRewarder):
        rewards = task.rewards(prompts, completion_texts, finished)
        if len(rewards) != len(prompts):
            raise InvalidArgumentError(
                f"{type(task).__name__} returned {len(rewards)} rewards for "
                f"{len(prompts)} completions"
            )
        return [float(r) for r in rewards]
    return [task.reward(p, t) for p, t in zip(prompts, completion_texts, strict=True)]


def prompt_id(task: str, text: str, answer: str) -> str:
    """An id that depends only on the content, so every searcher seeding the same prompts
    names them alike and PutPrompts stays idempotent across replicas and restarts."""
    digest = hashlib.sha256(f"{text}\0{answer}".encode()).hexdigest()[:20]
    return f"{task}-{digest}"


def make_prompt(task: str, text: str, answer: str) -> Prompt:
    return Prompt(id=prompt_id(task, text, answer), text=text, answer=answer)
