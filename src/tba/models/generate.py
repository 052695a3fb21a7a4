"""Text in, text out generation with a transformers causal LM, for evaluation (the policy's
completions) and for tasks that run a model (the red-teaming victim). Greedy at temperature
0, else sampling from the full distribution of logits / temperature; batched, left-padded.

Its parts are shared with the searcher's transformers engine (and `padded` with the tasks'
scoring models): the EOS ids and pad token, the padding of a batch and the cut after the
first EOS."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from tba.errors import InvalidArgumentError
from tba.models.decode import decode


@dataclass(frozen=True)
class GeneratedText:
    """One completion, cut after its first EOS. `finished` is False when the length limit
    ended it instead."""

    text: str
    token_ids: list[int]
    finished: bool


def generate_texts(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    max_new_tokens: int,
    temperature: float = 0.0,
    n: int = 1,
    batch_size: int = 64,
    seed: int | None = None,
) -> list[list[GeneratedText]]:
    """`n` completions of each prompt, in prompt order, `batch_size` rows (prompts x `n`) at
    a time. A prompt too long for the model's context keeps its end. Samples from the model
    itself (`tba.models.decode`), whatever generation defaults its hub config names."""
    if max_new_tokens < 1 or n < 1 or batch_size < 1 or temperature < 0:
        raise InvalidArgumentError("max_new_tokens, n and batch_size >= 1, temperature >= 0")
    eos_ids = eos_token_ids(tokenizer, model.config)
    pad_id = pad_token_id(tokenizer, eos_ids)
    keep = _prompt_budget(model, max_new_tokens)
    rows = [_prompt_ids(tokenizer, text, eos_ids[0])[-keep:] for text in prompts]
    per_chunk = max(1, batch_size // n)
    flat: list[GeneratedText] = []
    device = next(model.parameters()).device
    with torch.no_grad(), seeded(seed, device):
        for start in range(0, len(rows), per_chunk):
            inputs = padded(rows[start : start + per_chunk], pad_id, left=True, device=device)
            out = decode(
                model,
                inputs,
                n=n,
                max_new_tokens=max_new_tokens,
                temperature=temperature,
                eos_ids=eos_ids,
                pad_id=pad_id,
            )
            flat += [_generated_text(tokenizer, tokens, eos_ids) for tokens in out.tokens.tolist()]
    return [flat[i : i + n] for i in range(0, len(flat), n)]


def eos_token_ids(tokenizer: Any, config: Any) -> list[int]:
    """EOS ids of the tokenizer and the model config (which may list several)."""
    ids: list[int] = []
    for value in (tokenizer.eos_token_id, getattr(config, "eos_token_id", None)):
        for token in value if isinstance(value, list) else [value]:
            if token is not None and int(token) not in ids:
                ids.append(int(token))
    if not ids:
        raise InvalidArgumentError("the tokenizer and model config name no EOS token")
    return ids


def pad_token_id(tokenizer: Any, eos_ids: list[int]) -> int:
    """The tokenizer's pad token, else the first EOS (attention masks hide it either way)."""
    return int(tokenizer.pad_token_id) if tokenizer.pad_token_id is not None else eos_ids[0]


def _prompt_budget(model: Any, max_new_tokens: int) -> int:
    """Most prompt tokens that leave room for `max_new_tokens` in the model's context."""
    context = getattr(model.config, "max_position_embeddings", None)
    if context is None:
        return 1 << 62
    if context - max_new_tokens < 1:
        raise InvalidArgumentError(
            f"max_new_tokens {max_new_tokens} leaves no room for a prompt in the model's "
            f"context of {context}"
        )
    return int(context - max_new_tokens)


def _prompt_ids(tokenizer: Any, text: str, fallback: int) -> list[int]:
    # An empty prompt (an empty attack, say) still needs one token to condition on.
    return list(tokenizer(text)["input_ids"]) or [fallback]


def padded(
    rows: Sequence[Sequence[int]], pad_id: int, *, left: bool, device: torch.device
) -> dict[str, torch.Tensor]:
    """input_ids and attention_mask of `rows` padded to one width, and for left padding
    position_ids that count real tokens only, so the padding does not shift them (right
    padding keeps the model's own positions: RoBERTa's, for one, start past the pad id).
    Left padding puts every row's next token at the same last column."""
    width = max(len(row) for row in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        span = slice(width - len(row), width) if left else slice(0, len(row))
        input_ids[i, span] = torch.tensor(list(row), dtype=torch.long)
        attention_mask[i, span] = 1
    inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
    if left:
        inputs["position_ids"] = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    return {name: tensor.to(device) for name, tensor in inputs.items()}


def cut_at_eos(tokens: list[int], *, eos_ids: Sequence[int]) -> tuple[list[int], bool]:
    """The tokens up to and including the first EOS (kept: the policy chose to stop), the
    padding `generate` put after it gone, and whether there was one (else the length limit
    ended the completion)."""
    for i, token in enumerate(tokens):
        if token in eos_ids:
            return tokens[: i + 1], True
    return tokens, False


def _generated_text(tokenizer: Any, tokens: list[int], eos_ids: list[int]) -> GeneratedText:
    kept, finished = cut_at_eos(tokens, eos_ids=eos_ids)
    return GeneratedText(tokenizer.decode(kept, skip_special_tokens=True), kept, finished)


@contextlib.contextmanager
def seeded(seed: int | None, device: torch.device) -> Iterator[None]:
    """Seeds sampling without disturbing the process's global random state."""
    if seed is None:
        yield
        return
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        yield
