"""KV-cached decoding of left-padded batches with a transformers causal LM, for the searcher's
transformers engine and `generate_texts`, in place of `model.generate`, which kept every
step's scores to read the drawn tokens' log-probs from (rows x new tokens x vocabulary
floats); this keeps only those log-probs.

Each prompt's prefix (all but its last token) runs once into the cache, which is then repeated
for the prompt's `n` rows, so `n` samples share one prefill. Sampling is from the full
distribution of logits / temperature, cut to the nucleus when `top_p` < 1, drawn as
`generate` draws (`torch.multinomial` of the softmax), so a seed gives the same tokens; the
log-prob of each drawn token is read from that same distribution. Greedy at temperature 0."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Decoded:
    """New tokens, one row per (prompt, sample), prompt-major; a row that ended holds
    `pad_id` after its EOS. `logprobs[r, i]` is the log-prob of `tokens[r, i]` under the
    distribution it was drawn from (float32; meaningless after the row's EOS)."""

    tokens: torch.Tensor
    logprobs: torch.Tensor


def decode(
    model: Any,
    inputs: dict[str, torch.Tensor],
    *,
    n: int,
    max_new_tokens: int,
    temperature: float,
    eos_ids: Sequence[int],
    pad_id: int,
    top_p: float = 1.0,
) -> Decoded:
    """Up to `max_new_tokens` tokens for each of the `n` rows of every prompt in `inputs`
    (`padded(..., left=True)`: input_ids, attention_mask, position_ids), stopping early once
    every row has drawn an EOS."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    if inputs["input_ids"].shape[1] > 1:
        model(
            input_ids=inputs["input_ids"][:, :-1],
            attention_mask=inputs["attention_mask"][:, :-1],
            position_ids=inputs["position_ids"][:, :-1],
            past_key_values=cache,
            use_cache=True,
            # Only the cache is wanted: logits of every prefix position would be rows x
            # prompt tokens x vocabulary floats.
            logits_to_keep=1,
        )
        cache.batch_repeat_interleave(n)
    mask = inputs["attention_mask"].repeat_interleave(n, dim=0)
    positions = inputs["position_ids"][:, -1:].repeat_interleave(n, dim=0)
    last = inputs["input_ids"][:, -1:].repeat_interleave(n, dim=0)
    eos = torch.tensor(list(eos_ids), device=last.device)
    ended = torch.zeros(last.shape[0], dtype=torch.bool, device=last.device)
    tokens: list[torch.Tensor] = []
    logprobs: list[torch.Tensor] = []
    for _ in range(max_new_tokens):
        out = model(
            input_ids=last,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
        )
        token, logprob = _draw(out.logits[:, -1].float(), temperature, top_p)
        token = token.masked_fill(ended[:, None], pad_id)
        tokens.append(token)
        logprobs.append(logprob)
        ended |= torch.isin(token[:, 0], eos)
        if bool(ended.all()):
            break
        last, positions = token, positions + 1
        mask = torch.cat([mask, torch.ones_like(token)], dim=1)
    return Decoded(torch.cat(tokens, dim=1), torch.cat(logprobs, dim=1))


def _draw(
    logits: torch.Tensor, temperature: float, top_p: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row and its log-prob: the argmax at temperature 0, else a draw from
    softmax(logits / temperature) within the nucleus."""
    if temperature == 0:
        token = logits.argmax(dim=-1, keepdim=True)
        return token, logits.log_softmax(dim=-1).gather(-1, token)
    scores = logits / temperature
    if top_p < 1.0:
        scores = nucleus(scores, top_p)
    token = torch.multinomial(scores.softmax(dim=-1), num_samples=1)
    return token, scores.log_softmax(dim=-1).gather(-1, token)


def nucleus(scores: torch.Tensor, top_p: float) -> torch.Tensor:
    """`scores` with every token outside the smallest set of most likely tokens whose
    probability reaches `top_p` set to -inf (the most likely token always stays)."""
    ordered, order = scores.sort(dim=-1, descending=True)
    probs = ordered.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    outside_sorted = mass_before >= top_p
    outside = outside_sorted.scatter(-1, order, outside_sorted)
    return scores.masked_fill(outside, float("-inf"))
