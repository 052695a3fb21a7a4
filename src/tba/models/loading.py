"""Loading a model and its tokenizer from `[model]` settings: the tiny model built from a
config (tests, the demo), or a directory / hub name through transformers. Also the hashes
that make a run's identity (`tba.runs`): of the tokenizer and of the base weights."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch

from tba.models.config import ModelSettings
from tba.runs import RunIdentity, model_source_kind


def quiet_progress_bars() -> None:
    """Turns off transformers' progress bars, for a service's log: a weight version saved
    or loaded through transformers (converted or sharded weights) prints one each time."""
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()


def import_model_code() -> None:
    """Imports transformers' model and tokenizer classes, about 3 s of CPU on the demo's
    machine: a process that waits for something else first (a searcher for the trainer's
    run) spends its wait on them instead of its start."""
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: F401


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


# Files whose bytes are a directory's weights (transformers' formats).
_WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.pth")
_CHUNK_BYTES = 1 << 24


def tokenizer_sha256(tokenizer: Any) -> str:
    """sha256 of the canonical JSON of the vocabulary (token -> id, added tokens included)
    and the BOS, EOS and pad ids: two tokenizers with equal hashes encode alike."""
    content = {
        "vocab": sorted(tokenizer.get_vocab().items()),
        "special": [tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id],
    }
    text = json.dumps(content, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


def model_identity(
    settings: ModelSettings, seed: int, tokenizer: Any, model_config: Any
) -> RunIdentity:
    """The run identity's model fields: source, base weights and tokenizer."""
    return RunIdentity(
        model_source=model_source_kind(settings.source, Path(settings.source).is_dir()),
        model_revision=base_weights_revision(settings, seed, model_config),
        tokenizer_sha256=tokenizer_sha256(tokenizer),
    )


def base_weights_revision(settings: ModelSettings, seed: int, model_config: Any) -> str:
    """What names the base weights: `sha256:` of the parameters for `tiny` (built again
    from `seed`: the caller's copy may be trained already) and of the weight files for a
    directory; the commit transformers resolved for a hub name ('' when it reports none)."""
    if settings.source == "tiny":
        _, model = load_model(settings, seed)
        digest = hashlib.sha256()
        for name, tensor in sorted(model.state_dict().items()):
            digest.update(name.encode())
            digest.update(tensor.detach().contiguous().numpy().tobytes())
        return f"sha256:{digest.hexdigest()}"
    directory = Path(settings.source)
    if directory.is_dir():
        return f"sha256:{_files_sha256(directory)}"
    return str(getattr(model_config, "_commit_hash", None) or "")


def _files_sha256(directory: Path) -> str:
    digest = hashlib.sha256()
    files = sorted({p for pattern in _WEIGHT_PATTERNS for p in directory.glob(pattern)})
    for path in files:
        digest.update(path.name.encode() + b"\0")
        with path.open("rb") as stream:
            while chunk := stream.read(_CHUNK_BYTES):
                digest.update(chunk)
    return digest.hexdigest()
