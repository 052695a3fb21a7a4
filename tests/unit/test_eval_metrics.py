"""Evaluation's numbers: win rate, perplexity, attack success rate, and the diversity of
each prompt's completions (of the scored ones when sampled, else of samples drawn for it)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import pytest

from tba.eval.config import EvalSettings
from tba.eval.main import diversity_draw
from tba.eval.metrics import (
    mean,
    perplexity,
    success_rate,
    win_rate,
)
from tba.eval.suites import Complete, DiversityDraw, evaluate_math
from tba.tasks.arithmetic import ArithmeticTask
from tba.tasks.base import Split


def test_win_rate_counts_strict_wins():
    assert win_rate([1.0, 2.0, 3.0, 0.5], [0.0, 2.0, 4.0, 0.0]) == 0.5
    with pytest.raises(ValueError):
        win_rate([1.0], [1.0, 2.0])
    with pytest.raises(ValueError):
        win_rate([], [])


def test_perplexity_and_success_rate():
    assert perplexity(-2 * math.log(4.0), 2) == pytest.approx(4.0)
    assert perplexity(0.0, 3) == 1.0
    with pytest.raises(ValueError):
        perplexity(-1.0, 0)
    assert success_rate([0.2, 0.5, 0.51, 0.9], 0.5) == 0.5
    with pytest.raises(ValueError):
        success_rate([], 0.5)
    assert mean([]) is None
    assert mean([1.0, 2.0]) == 1.5


@dataclass(frozen=True)
class Text:
    text: str
    token_ids: list[int]
    finished: bool = True


def scripted(*completions: Text) -> Complete:
    """A completer that hands out `completions` in order, whatever the prompts."""
    queue = list(completions)

    def complete(texts: Sequence[str]) -> list[Text]:
        taken, queue[:] = queue[: len(texts)], queue[len(texts) :]
        return taken

    return complete


PROMPTS = ArithmeticTask().prompts(Split.TEST)[:2]


def test_sampled_groups_are_measured_as_they_are():
    # Prompt 1: answers 5 and 6, bigrams {12} and {13}: ratio 1, distance 1. Prompt 2: 7
    # twice, same tokens: ratio 1/2, distance 0.
    complete = scripted(Text("5", [1, 2]), Text(" 6", [1, 3]), Text("7", [4]), Text("7 ", [4]))
    metrics = evaluate_math(ArithmeticTask(), PROMPTS, complete, 2, "test").metrics
    assert metrics["eval/distinct_answer_ratio"] == 0.75
    assert metrics["eval/pairwise_distance"] == 0.5
    assert metrics["eval/diversity_samples"] == 4


def test_greedy_completions_draw_samples_for_diversity_alone():
    complete = scripted(Text("5", [1]), Text("6", [2]))
    # For the first prompt only: answers 5, 5, 7; token pairs at distances 0, 1, 1.
    draw = DiversityDraw(scripted(Text("5", [1]), Text("5", [1]), Text("7", [2])), 3, 1)
    metrics = evaluate_math(ArithmeticTask(), PROMPTS, complete, 1, "test", draw).metrics
    assert metrics["eval/distinct_answer_ratio"] == pytest.approx(2 / 3)
    assert metrics["eval/pairwise_distance"] == pytest.approx(2 / 3)
    assert metrics["eval/diversity_samples"] == 3
    one_each = scripted(Text("5", [1]), Text("6", [2]))
    alone = evaluate_math(ArithmeticTask(), PROMPTS, one_each, 1, "test").metrics
    assert alone["eval/distinct_answer_ratio"] is None and alone["eval/pairwise_distance"] is None


def test_samples_are_drawn_for_diversity_only_when_the_scored_ones_are_no_sampled_groups():
    temperatures: list[float] = []

    def sample(temperature: float) -> Complete:
        temperatures.append(temperature)
        return scripted()

    greedy = EvalSettings(diversity_temperature=0.7, diversity_prompts=5)
    draw = diversity_draw(greedy, sample)
    assert draw is not None and (draw.samples, draw.prompts, temperatures) == (4, 5, [0.7])
    assert diversity_draw(EvalSettings(samples_per_prompt=3, temperature=1.0), sample) is None
    assert diversity_draw(EvalSettings(samples_per_prompt=3), sample) is not None
    assert diversity_draw(EvalSettings(diversity_samples=1), sample) is None
