"""Loading a model and its tokenizer from `[model]` settings: the tiny model built from a
config (tests, the demo), or a directory / hub name through transformers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tba.models.config import ModelSettings


def load_model(settings: ModelSettings, seed: int = 0) -> tuple[Any, Any]:
    """(tokenizer, model) in fp32 with a pad token; `tiny` is built from `seed`."""
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
    return tokenizer, model


def materialize(settings: ModelSettings, seed: int, directory: Path) -> Path:
    """A `from_pretrained` directory (or hub name) holding the model `settings` names, for
    engines that load from one (vLLM): `source` itself unless it is `tiny`, which is built
    from `seed` and saved with its tokenizer into `directory`."""
    if settings.source != "tiny":
        return Path(settings.source)
    tokenizer, model = load_model(settings, seed)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory, safe_serialization=True)
    tokenizer.save_pretrained(directory)
    return directory
