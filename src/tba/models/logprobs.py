"""Sequence log-probabilities of completions, shared by the trainer (policy) and the
searcher (reference), so both compute exactly the same quantity (DESIGN.md section 2):
logits divided by the sampling temperature, completion tokens only (prompt and padding
masked, a final EOS counted)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PackedBatch:
    """Right-padded prompt+completion rows and the mask of completion targets."""

    input_ids: torch.Tensor  # [N, L] int64
    attention_mask: torch.Tensor  # [N, L] int64
    position_ids: torch.Tensor  # [N, L] int64
    completion_mask: torch.Tensor  # [N, L-1] float: 1 where target token L[i+1] is completion


def pack(
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    pad_token_id: int,
    device: torch.device | str = "cpu",
) -> PackedBatch:
    if len(prompts) != len(completions):
        raise ValueError("prompts and completions differ in number")
    if any(len(p) == 0 for p in prompts) or any(len(c) == 0 for c in completions):
        raise ValueError("every prompt and completion needs at least one token")
    width = max(len(p) + len(c) for p, c in zip(prompts, completions, strict=True))
    n = len(prompts)
    input_ids = torch.full((n, width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((n, width), dtype=torch.long)
    completion_mask = torch.zeros((n, width - 1), dtype=torch.float32)
    for row, (prompt, completion) in enumerate(zip(prompts, completions, strict=True)):
        length = len(prompt) + len(completion)
        input_ids[row, :length] = torch.tensor([*prompt, *completion], dtype=torch.long)
        attention_mask[row, :length] = 1
        # Target position t predicts token t+1: completion tokens are targets
        # len(prompt)-1 .. length-2.
        completion_mask[row, len(prompt) - 1 : length - 1] = 1.0
    # Explicit positions keep log-probs right whatever the padding side.
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    return PackedBatch(
        input_ids.to(device),
        attention_mask.to(device),
        position_ids.to(device),
        completion_mask.to(device),
    )


def token_logprobs(model: torch.nn.Module, batch: PackedBatch, temperature: float) -> torch.Tensor:
    """[N, L-1] log-prob of each next token under `model` with temperature-scaled logits,
    zero outside the completion."""
    if temperature <= 0:
        raise ValueError("temperature must be > 0")
    logits = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        # One pass over whole sequences: a KV cache would only be built and dropped (4% of a
        # reference forward pass on CPU).
        use_cache=False,
    ).logits[:, :-1, :]
    logits = logits.float() / temperature
    targets = batch.input_ids[:, 1:].unsqueeze(-1)
    picked = torch.gather(logits, dim=-1, index=targets).squeeze(-1)
    logprobs = picked - torch.logsumexp(logits, dim=-1)
    return logprobs * batch.completion_mask


def sequence_logprobs(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    temperature: float,
    pad_token_id: int,
) -> torch.Tensor:
    """[N] sum of completion-token log-probs; differentiable (wrap in no_grad for inference)."""
    device = next(model.parameters()).device
    batch = pack(prompts, completions, pad_token_id, device)
    return token_logprobs(model, batch, temperature).sum(dim=-1)
