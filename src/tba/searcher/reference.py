"""Reference log-probs on the searcher: log π_ref(y|x) of each completion under the frozen base
model (never the hot-reloaded policy), computed once here and stored with the trajectory so
the trainer never runs the reference model (DESIGN.md section 2)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from tba.models.logprobs import sequence_logprobs


class ReferenceScorer:
    def __init__(
        self,
        model: Any,
        pad_token_id: int,
        temperature: float,
        batch_size: int,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> None:
        self.model: Any = model.to(device=device, dtype=dtype)
        self.model.eval()
        self.model.requires_grad_(False)
        self.pad_token_id = pad_token_id
        self.temperature = temperature
        self.batch_size = batch_size

    def score(
        self, prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]]
    ) -> list[float]:
        """Temperature-scaled sequence log-probs of each (prompt, completion), in order."""
        if len(prompts) != len(completions):
            raise ValueError("prompts and completions differ in number")
        # Batches of similar lengths waste less compute on padding.
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]) + len(completions[i]))
        values = [0.0] * len(prompts)
        with torch.no_grad():
            for start in range(0, len(order), self.batch_size):
                batch = order[start : start + self.batch_size]
                logprobs = sequence_logprobs(
                    self.model,
                    [prompts[i] for i in batch],
                    [completions[i] for i in batch],
                    self.temperature,
                    self.pad_token_id,
                )
                for i, value in zip(batch, logprobs.float().cpu().tolist(), strict=True):
                    values[i] = value
        return values
