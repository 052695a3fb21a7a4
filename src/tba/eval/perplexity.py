"""Perplexity of completions under a reference causal LM (preference evaluation: how far the
policy's outputs drift from what the SFT model would write)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from tba.eval.metrics import perplexity
from tba.models.logprobs import sequence_logprobs


class ReferencePerplexity:
    def __init__(self, tokenizer: Any, model: Any, batch_size: int = 16) -> None:
        self.tokenizer = tokenizer
        self.model = model.eval().requires_grad_(False)
        self.batch_size = batch_size
        self.context: int | None = getattr(model.config, "max_position_embeddings", None)

    def __call__(self, prompts: Sequence[str], completions: Sequence[str]) -> list[float | None]:
        """Per completion exp(mean token NLL) given its prompt, at temperature 1; None for a
        completion with no tokens. The reference re-tokenizes both texts."""
        rows = [self._tokens(p, c) for p, c in zip(prompts, completions, strict=True)]
        scored = [i for i, (_, completion) in enumerate(rows) if completion]
        values: list[float | None] = [None] * len(rows)
        with torch.no_grad():
            for start in range(0, len(scored), self.batch_size):
                batch = scored[start : start + self.batch_size]
                logprobs = sequence_logprobs(
                    self.model,
                    [rows[i][0] for i in batch],
                    [rows[i][1] for i in batch],
                    temperature=1.0,
                    pad_token_id=self.tokenizer.pad_token_id,
                )
                for i, value in zip(batch, logprobs.float().cpu().tolist(), strict=True):
                    values[i] = perplexity(value, len(rows[i][1]))
        return values

    def _tokens(self, prompt: str, completion: str) -> tuple[list[int], list[int]]:
        prompt_ids = list(self.tokenizer(prompt)["input_ids"]) or [self.tokenizer.eos_token_id]
        completion_ids = list(self.tokenizer(completion, add_special_tokens=False)["input_ids"])
        if self.context is not None:
            # Keep the completion (what is measured) and as much prompt as fits before it.
            completion_ids = completion_ids[: self.context - 1]
            prompt_ids = prompt_ids[-(self.context - len(completion_ids)) :]
        return prompt_ids, completion_ids
