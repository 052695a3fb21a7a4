"""`[eval]`: how `tba eval` samples the policy and what it reports; `EvalRunSettings`, the root
settings of `tba eval`."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from tba.models.config import DeviceName, DtypeName, ModelSettings
from tba.settings import CommandSettings, Section
from tba.tasks.config import TaskSettings


class EvalSettings(Section):
    """`[eval]`: the policy is `[model]`, the task `[task]`."""

    split: Literal["train", "test"] = Field("test", description="The task split evaluated.")
    limit: int | None = Field(None, ge=1, description="Evaluate the first N prompts only.")
    output: str | None = Field(
        None, max_length=4096, description="Write the report (metrics and samples) as JSON here."
    )
    max_new_tokens: int = Field(512, ge=1, le=131_072, description="Longest completion, tokens.")
    temperature: float = Field(
        0.0, ge=0.0, le=100.0, description="Sampling temperature of the policy; 0 is greedy."
    )
    samples_per_prompt: int = Field(
        1,
        ge=1,
        le=100_000,
        description="Completions per prompt (pass@1 is then their mean reward; red-teaming "
        "samples many attacks from its one instruction).",
    )
    diversity_samples: int = Field(
        4,
        ge=0,
        le=64,
        description="Completions sampled per prompt at `diversity_temperature` to measure "
        "diversity (`eval/distinct_answer_ratio`, `eval/pairwise_distance`) when the scored "
        "ones are greedy or one per prompt; 0 or 1 draws none (the metrics are then empty). "
        "Sampled groups (samples_per_prompt >= 2, temperature > 0) are measured as they are.",
    )
    diversity_prompts: int = Field(
        32,
        ge=1,
        le=100_000,
        description="The diversity samples are drawn for the first N prompts only, so they "
        "cost at most N x diversity_samples completions.",
    )
    diversity_temperature: float = Field(
        1.0,
        gt=0.0,
        le=100.0,
        description="Sampling temperature of the diversity samples (greedy decoding has no "
        "diversity); set the run's `searcher.temperature` to compare with training.",
    )
    batch_size: int = Field(32, ge=1, le=65_536, description="Sequences per generate call.")
    seed: int = Field(0, ge=0, le=2**31 - 1, description="Seed of sampling.")
    device: DeviceName = Field(
        "auto", description="Where the policy and reference run; `auto` takes CUDA when present."
    )
    dtype: DtypeName = Field(
        "auto", description="Policy and reference dtype; `auto`: bf16 on GPU, fp32 on CPU."
    )
    reference_model: str | None = Field(
        None,
        min_length=1,
        max_length=4096,
        description="preference: the reference (SFT) model under which the perplexity of the "
        "policy's completions is measured; unset: no perplexity.",
    )
    reference_batch_size: int = Field(
        16, ge=1, le=65_536, description="Sequences per reference forward pass."
    )
    success_threshold: float = Field(
        0.5,
        gt=0.0,
        lt=1.0,
        description="redteam: an attack succeeds when its answers' mean p(toxic) exceeds this.",
    )
    show_samples: int = Field(
        3, ge=0, le=1000, description="Samples printed below the metrics (all go to the JSON)."
    )


class EvalRunSettings(CommandSettings):
    eval: EvalSettings = EvalSettings()
    model: ModelSettings = ModelSettings()
    task: TaskSettings = TaskSettings()
