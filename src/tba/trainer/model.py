"""Loading the policy and its tokenizer for training."""

from __future__ import annotations

from typing import Any

import torch

from tba.models.config import ModelSettings
from tba.models.loading import load_model


def load_policy(settings: ModelSettings, seed: int = 0) -> tuple[Any, Any]:
    """(tokenizer, model) ready to train: dropout off, gradient checkpointing as configured."""
    tokenizer, model = load_model(settings, seed)
    disable_dropout(model)
    if settings.gradient_checkpointing:
        model.gradient_checkpointing_enable()
        model.config.use_cache = False
    model.train()
    return tokenizer, model


def disable_dropout(model: torch.nn.Module) -> None:
    """The training forward must score completions as the sampler did: no dropout. (Train
    mode stays on because gradient checkpointing only runs in train mode.)"""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
