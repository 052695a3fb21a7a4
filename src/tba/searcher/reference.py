"""Reference log-probs on the searcher: log π_ref(y|x) of each completion under the frozen base
model (never the hot-reloaded policy), computed once here and stored with the trajectory so
the trainer never runs the reference model (DESIGN.md section 2).

This forward pass is most of a round's finish stage, whose CPU comes out of the next round's
generation when no core is spare, so it wastes as little as it can: completions are planned
into the packed sequences `token_logprobs` runs (a prompt's short completions share one),
and the sequences sorted by length and batched so that padding stays within `MAX_PADDING` of
the tokens scored, under inference mode. The reference never changes, so a prompt whose
completions in this call were all scored before (kept up to `cache_tokens` prompt and
completion tokens, least recently used out first) is looked up instead: in the demo a policy
that has learned a prompt samples the same few answers when the prompt comes back. Only
whole prompts are skipped: dropping some of a prompt's completions would leave its packed
sequence shorter than the others, and batches cut for padding would cost more forward
passes than the rows saved (measured: 2.4 passes a round instead of 1, 7.7 ms against 6.8)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import torch

from tba.domain import pack_logprobs
from tba.models.logprobs import hidden_size_of, packed_length, plan_sequences, token_logprobs
from tba.searcher.finish import ReferenceLogprobs

# Padded positions cost as much as real ones, and on a CPU a forward pass costs about the same
# per token from 4 rows a batch up, so a batch is cut where padding would pass this fraction of
# its tokens. Measured on the benchmark's 6-layer model: batches of 32 random-length
# completions held 22% padding; cut at 10% they hold 5%, and a round takes 13% less CPU.
MAX_PADDING = 0.1

# (temperature, prompt, completion): tuples of small ints, cheaper to build per row than
# packed bytes, about 8 bytes a token.
_Key = tuple[float, tuple[int, ...], tuple[int, ...]]


class ReferenceScorer:
    def __init__(
        self,
        model: Any,
        pad_token_id: int,
        batch_size: int,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        cache_tokens: int = 0,
    ) -> None:
        self.model: Any = model.to(device=device, dtype=dtype)
        self.model.eval()
        self.model.requires_grad_(False)
        self.pad_token_id = pad_token_id
        self.batch_size = batch_size
        self.cache_tokens = cache_tokens
        self._cache: OrderedDict[_Key, ReferenceLogprobs] = OrderedDict()
        self._cached_tokens = 0

    def score(
        self,
        prompts: Sequence[Sequence[int]],
        completions: Sequence[Sequence[int]],
        temperature: float,
    ) -> list[ReferenceLogprobs]:
        """Log-probs of logits / `temperature` (the round's sampling temperature) of each
        (prompt, completion), in order: the sequence sum (`sequence_logprobs`, bit for bit,
        where it was scored) and its per-token values."""
        if len(prompts) != len(completions):
            raise ValueError("prompts and completions differ in number")
        pairs = zip(prompts, completions, strict=True)
        keys = [(temperature, tuple(p), tuple(c)) for p, c in pairs]
        results: list[ReferenceLogprobs | None] = [None] * len(keys)
        rows = []
        for prompt_rows in _rows_by_prompt(keys):
            # A prompt's completions are packed into one sequence: scored all or none.
            hits = [v for i in prompt_rows if (v := self._cached(keys[i])) is not None]
            if len(hits) == len(prompt_rows):
                for i, value in zip(prompt_rows, hits, strict=True):
                    results[i] = _looked_up(value)
            else:
                rows.extend(prompt_rows)
        rows.sort()
        if rows:
            new = self._score(
                [prompts[i] for i in rows], [completions[i] for i in rows], temperature
            )
            for i, value in zip(rows, new, strict=True):
                results[i] = value
                self._remember(keys[i], value)
        return [value for value in results if value is not None]

    def _cached(self, key: _Key) -> ReferenceLogprobs | None:
        value = self._cache.get(key)
        if value is not None:
            self._cache.move_to_end(key)
        return value

    def _remember(self, key: _Key, value: ReferenceLogprobs) -> None:
        tokens = _tokens_of(key)
        if key in self._cache or tokens > self.cache_tokens:
            return
        self._cache[key] = value
        self._cached_tokens += tokens
        while self._cached_tokens > self.cache_tokens:
            self._cached_tokens -= _tokens_of(self._cache.popitem(last=False)[0])

    def _score(
        self,
        prompts: Sequence[Sequence[int]],
        completions: Sequence[Sequence[int]],
        temperature: float,
    ) -> list[ReferenceLogprobs]:
        width = hidden_size_of(self.model)
        sequences = plan_sequences(prompts, completions, width, self.batch_size)
        lengths = [packed_length(prompts, completions, rows) for rows in sequences]
        values: dict[int, ReferenceLogprobs] = {}
        with torch.inference_mode():
            for batch in length_batches(lengths, self.batch_size, [len(r) for r in sequences]):
                rows = [i for s in batch for i in sequences[s]]
                scored = token_logprobs(
                    self.model,
                    [prompts[i] for i in rows],
                    [completions[i] for i in rows],
                    temperature,
                    self.pad_token_id,
                )
                sums = scored.sums().float().cpu().tolist()
                tokens = scored.cpu_rows()
                for i, total, row_tokens in zip(rows, sums, tokens, strict=True):
                    values[i] = ReferenceLogprobs(total, pack_logprobs(row_tokens))
        return [values[i] for i in range(len(prompts))]


def _rows_by_prompt(keys: Sequence[_Key]) -> list[list[int]]:
    rows: dict[tuple[int, ...], list[int]] = {}
    for i, (_, prompt, _) in enumerate(keys):
        rows.setdefault(prompt, []).append(i)
    return list(rows.values())


def _tokens_of(key: _Key) -> int:
    return len(key[1]) + len(key[2])


def _looked_up(value: ReferenceLogprobs) -> ReferenceLogprobs:
    return ReferenceLogprobs(value.logprob, value.token_logprobs, looked_up=True)


def length_batches(
    lengths: Sequence[int],
    max_rows: int,
    rows: Sequence[int] | None = None,
    max_padding: float = MAX_PADDING,
) -> list[list[int]]:
    """Indices of `lengths` (sequences of `rows[i]` completions each, default 1) in batches of
    at most `max_rows` completions: in order of length, a batch is cut before the sequence
    that would pad it past `max_padding` of its tokens."""
    sizes = rows if rows is not None else [1] * len(lengths)
    batches: list[list[int]] = []
    tokens = held = 0
    for i in sorted(range(len(lengths)), key=lengths.__getitem__):
        width = lengths[i]  # in sorted order, the widest sequence of its batch so far
        count = len(batches[-1]) if batches else 0
        full = not batches or held + sizes[i] > max_rows
        if full or (count + 1) * width > (1 + max_padding) * (tokens + width):
            batches.append([])
            tokens = held = 0
        batches[-1].append(i)
        tokens += width
        held += sizes[i]
    return batches
