"""evaluate(): one completion per prompt from an injected function, scored by the task."""

from __future__ import annotations

import pytest

from tba.domain import Prompt
from tba.errors import InvalidArgumentError
from tba.tasks.arithmetic import ArithmeticTask
from tba.tasks.base import Split
from tba.tasks.config import ArithmeticSettings
from tba.tasks.evaluate import evaluate


@pytest.fixture
def task() -> ArithmeticTask:
    return ArithmeticTask(ArithmeticSettings(test_size=8))


def right_on_even_positions(prompts: list[Prompt]) -> list[str]:
    return [p.answer if i % 2 == 0 else "x" for i, p in enumerate(prompts)]


def test_accuracy_is_the_mean_reward(task):
    prompts = task.prompts(Split.TEST)
    result = evaluate(task, prompts, right_on_even_positions)
    assert result.task == "arithmetic"
    assert result.count == 8
    assert result.accuracy == 0.5
    assert result.metrics() == {"eval/accuracy": 0.5, "eval/count": 8.0}


def test_per_prompt_results_keep_the_order(task):
    prompts = task.prompts(Split.TEST)[:3]
    result = evaluate(task, prompts, right_on_even_positions)
    assert [r.prompt for r in result.results] == prompts
    assert [r.completion_text for r in result.results] == [
        prompts[0].answer,
        "x",
        prompts[2].answer,
    ]
    assert [r.reward for r in result.results] == [1.0, 0.0, 1.0]


def test_complete_sees_every_prompt_once(task):
    seen: list[list[Prompt]] = []

    def complete(prompts: list[Prompt]) -> list[str]:
        seen.append(prompts)
        return [p.answer for p in prompts]

    prompts = task.prompts(Split.TEST)
    assert evaluate(task, prompts, complete).accuracy == 1.0
    assert seen == [prompts]


def test_a_completion_count_mismatch_is_an_error(task):
    prompts = task.prompts(Split.TEST)
    with pytest.raises(InvalidArgumentError, match="returned 7 completions for 8 prompts"):
        evaluate(task, prompts, lambda batch: ["1"] * (len(batch) - 1))


def test_no_prompts_is_an_error(task):
    with pytest.raises(InvalidArgumentError, match="no prompts"):
        evaluate(task, [], right_on_even_positions)
