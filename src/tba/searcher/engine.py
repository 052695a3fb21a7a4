"""What a searcher needs of a generation engine: sample n completions per prompt (token ids,
text, behaviour log-prob sums and per-token log-probs, finish reasons), load a weight version
from a local directory without restarting (prepared on another thread while it generates,
then swapped in between rounds), and say which version it holds.

Implementations: `tba.searcher.hf_engine.TransformersEngine` (CPU default for small runs) and
`tba.searcher.vllm_engine.VllmEngine` (the main engine; the only module importing vLLM).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from tba.domain import FinishReason
from tba.errors import InvalidArgumentError

if TYPE_CHECKING:
    import torch


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
    reason STOP); a completion cut by `max_new_tokens` has no EOS (LENGTH).
    `behavior_logprob` is the sum of the sampled tokens' log-probs under logits /
    temperature, EOS included (the trajectory's `behavior_logprob`); `token_logprobs` are
    those log-probs one per token of `token_ids`, packed float32 (`tba.domain.pack_logprobs`),
    adding up to `behavior_logprob` to float32 rounding."""

    token_ids: list[int]
    text: str
    behavior_logprob: float
    finish_reason: FinishReason
    token_logprobs: bytes = b""


@dataclass(frozen=True)
class PreparedWeights:
    """A weight directory made ready for `swap_weights` off the generation thread: what the
    engine read from it beforehand (the transformers engine: every tensor, in the model's dtype
    and on its device; vLLM: nothing, its workers read the directory during the swap)."""

    weights_dir: Path
    tensors: Mapping[str, torch.Tensor] = field(default_factory=dict)


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

    def prepare_weights(self, weights_dir: Path) -> PreparedWeights:
        """Reads and checks a `from_pretrained` directory (same architecture and tokenizer)
        without changing the weights in use: safe while another thread generates. Weights
        that do not fit raise InvalidArgumentError."""
        ...

    def swap_weights(self, prepared: PreparedWeights, version: int) -> None:
        """Puts prepared weights in use as `version`; called between generations, this is
        all the pause a new version costs."""
        ...

    def load_weights(self, weights_dir: Path, version: int) -> None:
        """`prepare_weights` and `swap_weights` in one call."""
        ...

    def close(self) -> None: ...


def check_request(
    prompts: Sequence[Sequence[int]],
    params: SamplingParams,
    context_tokens: int | None,
    vocab_size: int | None = None,
) -> None:
    """What every engine refuses before generating: bad sampling parameters, empty prompts,
    prompts that fill the context, and (when the engine knows its vocabulary) unknown ids."""
    if params.n < 1 or params.max_new_tokens < 1:
        raise InvalidArgumentError("n and max_new_tokens must be at least 1")
    if not params.temperature > 0 or not 0 < params.top_p <= 1:
        raise InvalidArgumentError("temperature must be > 0 and top_p in (0, 1]")
    for i, prompt in enumerate(prompts):
        if not prompt:
            raise InvalidArgumentError(f"prompt {i} has no tokens")
        if context_tokens is not None and len(prompt) >= context_tokens:
            raise InvalidArgumentError(
                f"prompt {i} has {len(prompt)} tokens; the model's context is {context_tokens}"
            )
        if vocab_size is not None and (min(prompt) < 0 or max(prompt) >= vocab_size):
            raise InvalidArgumentError(
                f"prompt {i} has token ids outside the vocabulary [0, {vocab_size})"
            )
