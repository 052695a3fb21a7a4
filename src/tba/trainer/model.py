"""Loading the policy and its tokenizer for training."""

from __future__ import annotations

from typing import Any

import torch

from tba.trainer.config import ModelSettings


def load_policy(settings: ModelSettings, seed: int = 0) -> tuple[Any, Any]:
    """(tokenizer, model) ready to train: dropout off, gradient checkpointing as configured."""
    if settings.source == "tiny":
        from tba.models.tiny import build_tiny_model, build_tiny_tokenizer

        tokenizer = build_tiny_tokenizer()
        model = build_tiny_model(
            tokenizer,
            n_layer=settings.tiny_layers,
            n_embd=settings.tiny_width,
            n_head=settings.tiny_heads,
            n_positions=settings.tiny_positions,
            seed=seed,
        )
    else:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(settings.source)
        model = AutoModelForCausalLM.from_pretrained(settings.source, dtype=torch.float32)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
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
