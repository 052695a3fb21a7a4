"""`[model]`: the policy model, shared by the trainer (what it trains) and the searchers (what
they generate with, and the reference they score against)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from tba.settings import Section

# Where a model runs and in what precision (tba.models.device reads these names).
DeviceName = Literal["auto", "cpu", "cuda"]
DtypeName = Literal["auto", "fp32", "bf16", "fp16"]


class ModelSettings(Section):
    """`[model]`: the policy to train."""

    source: str = Field(
        "tiny",
        min_length=1,
        max_length=4096,
        description="`tiny` builds tba.models.tiny from the tiny_* fields; otherwise a "
        "directory (or hub name) for AutoModelForCausalLM and AutoTokenizer.",
    )
    dtype: Literal["fp32", "bf16"] = Field(
        "fp32", description="`bf16`: bfloat16 compute with fp32 master weights."
    )
    gradient_checkpointing: bool = Field(
        False, description="Recompute activations in backward to save memory."
    )
    tiny_layers: int = Field(3, ge=1, le=64, description="Layers of the tiny model.")
    tiny_width: int = Field(128, ge=8, le=8192, description="Hidden size of the tiny model.")
    tiny_heads: int = Field(4, ge=1, le=128, description="Attention heads of the tiny model.")
    tiny_positions: int = Field(
        256, ge=8, le=32_768, description="Context length of the tiny model."
    )
