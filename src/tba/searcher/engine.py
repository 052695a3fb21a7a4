"""What a searcher needs of a generation engine: sample n completions per prompt (token ids,
text, behaviour log-prob sums, finish reasons), load a weight version from a local directory
without restarting, and say which version it holds.

Implementations: `tba.searcher.hf_engine.TransformersEngine` (CPU default for small runs) and
`tba.searcher.vllm_engine.VllmEngine` (the main engine; the only module importing vLLM).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from tba.domain import FinishReason


@dataclass(frozen=True)
class SamplingParams:
    """How to sample. Behaviour log-probs are of the distribution actually sampled:
    logits / temperature over the full vocabulary (no top-k; `top_p` 1.0)."""

    n: int
    max_new_tokens: int
    temperature: float
    top_p: float = 1.0
    seed: int | None = None


@dataclass(frozen=True)
class Completion:
    """One sampled completion. `token_ids` end at the first EOS, which is included (finish
    reason STOP); a completion cut by `max_new_tokens` has no EOS (LENGTH). `logprob` is the
    sum of the sampled tokens' log-probs under logits / temperature, EOS included."""

    token_ids: list[int]
    text: str
    logprob: float
    finish_reason: FinishReason


class GenerationEngine(Protocol):
    @property
    def version(self) -> int:
        """The weight version loaded (0: the base model the engine started from)."""
        ...

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams
    ) -> list[list[Completion]]:
        """`params.n` completions for each prompt (token ids), in prompt order."""
        ...

    def load_weights(self, weights_dir: Path, version: int) -> None:
        """Swaps in the weights of a `from_pretrained` directory (same architecture and
        tokenizer) as `version`; generation pauses only for the swap."""
        ...

    def close(self) -> None: ...
