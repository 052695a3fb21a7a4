"""KV-cached decoding of left-padded batches with a transformers causal LM, for the searcher's
transformers engine and `generate_texts`, in place of `model.generate`, which kept every
step's scores to read the drawn tokens' log-probs from (rows x new tokens x vocabulary
floats); this keeps only those log-probs.

Rows share a cache row while their contexts are the same: each prompt runs once, for all its
`n` rows, and from then on the rows that drew the same tokens so far run once too, so a
forward covers the distinct contexts still going, not every row (a peaked policy's `n`
samples often agree; rows that ended are not run at all). Sampling is from the full
distribution of logits / temperature, cut to the nucleus when `top_p` < 1, drawn for every
row as `generate` draws (`torch.multinomial` of the softmax), so a seed gives the same tokens;
the log-prob of each drawn token is read from that same distribution. Greedy at temperature
0."""

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
    mask, positions = inputs["attention_mask"], inputs["position_ids"][:, -1:]
    # Only the last position's logits: every prefix position's would be rows x prompt
    # tokens x vocabulary floats.
    logits = _next_logits(model, inputs["input_ids"], mask, inputs["position_ids"], cache)
    context = torch.arange(len(mask), device=mask.device).repeat_interleave(n)
    eos = torch.tensor(list(eos_ids), device=mask.device)
    ended = torch.zeros(len(context), dtype=torch.bool, device=mask.device)
    tokens: list[torch.Tensor] = []
    logprobs: list[torch.Tensor] = []
    for step in range(max_new_tokens):
        token, logprob = _draw(logits[context], temperature, top_p)
        token = token.masked_fill(ended[:, None], pad_id)
        tokens.append(token)
        logprobs.append(logprob)
        ended |= torch.isin(token[:, 0], eos)
        if step + 1 == max_new_tokens or bool(ended.all()):
            break
        parents, next_tokens, context = _branches(context, token[:, 0], ended, logits.shape[-1])
        if not _is_identity(parents, len(mask)):
            cache.batch_select_indices(parents)
            mask, positions = mask[parents], positions[parents]
        mask = torch.cat([mask, torch.ones_like(next_tokens)], dim=1)
        positions = positions + 1
        logits = _next_logits(model, next_tokens, mask, positions, cache)
    return Decoded(torch.cat(tokens, dim=1), torch.cat(logprobs, dim=1))


def _next_logits(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    cache: Any,
) -> torch.Tensor:
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=1,
    )
    return out.logits[:, -1].float()


def _branches(
    context: torch.Tensor, token: torch.Tensor, ended: torch.Tensor, vocab: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The rows still going, grouped by (context, token just drawn): a group's rows have the
    same context from here on. Returns each group's parent context (a cache row) and token,
    in the order of the parents, and each row's group; rows that ended point at group 0 (what
    they draw is discarded)."""
    going = ~ended
    groups, group_of_row = torch.unique(context[going] * vocab + token[going], return_inverse=True)
    row_group = torch.zeros_like(context)
    row_group[going] = group_of_row
    return groups // vocab, (groups % vocab)[:, None], row_group


def _is_identity(parents: torch.Tensor, contexts: int) -> bool:
    """Whether each context goes on as one group in place, so the cache needs no copy."""
    return len(parents) == contexts and bool(
        torch.equal(parents, torch.arange(contexts, device=parents.device))
    )


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
