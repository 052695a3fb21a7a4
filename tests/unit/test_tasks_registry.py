"""Task names -> tasks: every registered name builds, an unknown one lists the known ones."""

from __future__ import annotations

import json

import pytest

from tba.errors import InvalidArgumentError
from tba.tasks.base import Split
from tba.tasks.config import ArithmeticSettings, Gsm8kSettings, TaskSettings
from tba.tasks.registry import BUILDERS, build_task


def test_known_names():
    assert set(BUILDERS) >= {"arithmetic", "gsm8k"}


def test_an_unknown_name_lists_the_known_ones():
    with pytest.raises(InvalidArgumentError, match="'gsm8kk'") as caught:
        build_task(TaskSettings(name="gsm8kk"))
    assert f"known tasks: {', '.join(sorted(BUILDERS))}" in str(caught.value)
    assert "arithmetic, gsm8k" in str(caught.value)


def test_arithmetic_still_builds_from_its_section():
    task = build_task(TaskSettings(arithmetic=ArithmeticSettings(test_size=10)))
    assert task.name == "arithmetic"
    test_prompts = task.prompts(Split.TEST)
    assert len(test_prompts) == 10
    prompt = test_prompts[0]
    assert task.reward(prompt, prompt.answer) == 1.0
    assert task.reward(prompt, prompt.answer + "0") == 0.0


def test_gsm8k_builds_from_its_section(tmp_path):
    row = json.dumps({"question": "What is 2+3?", "answer": "2+3=<<2+3=5>>5\n#### 5"})
    for split in Split:
        (tmp_path / f"{split}.jsonl").write_text(row + "\n")
    settings = TaskSettings(
        name="gsm8k", gsm8k=Gsm8kSettings(source=str(tmp_path), template="Q: {question}\nA:")
    )
    task = build_task(settings)
    assert task.name == "gsm8k"
    [prompt] = task.prompts(Split.TRAIN)
    assert prompt.text == "Q: What is 2+3?\nA:"
    assert task.reward(prompt, "so 2+3 = 5.") == 1.0
