"""`[task]`: which task a searcher (or an evaluation) runs, and its parameters."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from tba.settings import Section

DEFAULT_GSM8K_TEMPLATE = "[MATH_TASK] Problem:\n{question}\n\nSolution:"


class ArithmeticSettings(Section):
    """`[task.arithmetic]`: synthetic addition `a+b=` -> `a+b`, for tiny models."""

    min_operand: int = Field(10, ge=0, le=10**6, description="Smallest operand.")
    max_operand: int = Field(99, ge=1, le=10**6, description="Largest operand.")
    test_size: int = Field(
        500, ge=1, le=100_000, description="Held-out pairs, never in the train split."
    )
    seed: int = Field(0, ge=0, description="Seed of the train/test partition of all pairs.")

    @model_validator(mode="after")
    def _check_sizes(self) -> ArithmeticSettings:
        pairs = (self.max_operand - self.min_operand + 1) ** 2
        if self.max_operand < self.min_operand or pairs <= self.test_size:
            raise ValueError("the operand range must hold more pairs than test_size")
        return self


class Gsm8kSettings(Section):
    """`[task.gsm8k]`: grade-school maths in the `openai/gsm8k` format."""

    source: str = Field(
        "openai/gsm8k",
        min_length=1,
        description="A directory with train.jsonl and test.jsonl (rows with `question` and "
        "`answer`), or a hub dataset name loaded with `datasets` (config `main`).",
    )
    template: str = Field(
        DEFAULT_GSM8K_TEMPLATE,
        min_length=10,
        description="Prompt template with a `{question}` field; the default is the one the "
        "paper's RhoMath-1B SFT model was trained on.",
    )
    verifier: Literal["last_number", "math_verify"] = Field(
        "last_number",
        description="`last_number`: reward 1 when the last number of the response equals the "
        "gold; `math_verify`: equivalence by the math-verify package.",
    )
    limit: int | None = Field(
        None, ge=1, description="Use only the first N rows of each split (smoke runs)."
    )

    @model_validator(mode="after")
    def _check_template(self) -> Gsm8kSettings:
        if "{question}" not in self.template:
            raise ValueError("template must contain {question}")
        return self


class TaskSettings(Section):
    """`[task]`: the task whose prompts seed the buffer and whose reward scores completions."""

    name: str = Field(
        "arithmetic", min_length=1, max_length=64, description="A registered task name."
    )
    arithmetic: ArithmeticSettings = ArithmeticSettings()
    gsm8k: Gsm8kSettings = Gsm8kSettings()
