"""The searcher's reference scorer: packed sequences in batches of similar lengths with bounded
padding and completions, and values equal to `sequence_logprobs` of each
completion alone, in the caller's order."""

from __future__ import annotations

import random

import torch

from tba.domain import unpack_logprobs
from tba.models.config import ModelSettings
from tba.models.loading import load_model
from tba.models.logprobs import sequence_logprobs
from tba.searcher.finish import ReferenceLogprobs
from tba.searcher.reference import MAX_PADDING, ReferenceScorer, length_batches

MODEL = ModelSettings(tiny_layers=1, tiny_width=32, tiny_heads=2, tiny_positions=64)


def test_batches_hold_every_row_once_within_the_row_and_padding_bounds():
    lengths = [random.Random(seed).randrange(1, 60) for seed in range(200)] + [7] * 40
    batches = length_batches(lengths, max_rows=16)
    assert sorted(i for batch in batches for i in batch) == list(range(len(lengths)))
    for batch in batches:
        widths = [lengths[i] for i in batch]
        assert len(batch) <= 16
        assert len(batch) * max(widths) <= (1 + MAX_PADDING) * sum(widths)
    # Equal lengths pad nothing, so they fill whole batches.
    assert [len(b) for b in length_batches([9] * 40, max_rows=16)] == [16, 16, 8]


def test_a_row_longer_than_its_neighbours_gets_a_batch_of_its_own():
    assert length_batches([5, 50, 5, 5], max_rows=8) == [[0, 2, 3], [1]]


def test_batches_count_the_completions_of_each_sequence():
    batches = length_batches([10, 10, 10, 10], max_rows=8, rows=[3, 3, 3, 2])
    assert [sum([3, 3, 3, 2][i] for i in b) for b in batches] == [6, 5]


def test_scores_equal_each_completion_scored_alone_in_order():
    tokenizer, model = load_model(MODEL, 0)
    rng = random.Random(0)
    prompts = [[1, *rng.choices(range(4, 40), k=rng.randrange(1, 8))] for _ in range(8)]
    prompts = [rng.choice(prompts) for _ in range(23)]
    completions = [rng.choices(range(4, 40), k=rng.randrange(1, 30)) for _ in range(23)]
    scorer = ReferenceScorer(model, tokenizer.pad_token_id, batch_size=4)
    got = scorer.score(prompts, completions, 0.7)
    with torch.no_grad():
        alone = [
            sequence_logprobs(model, [p], [c], 0.7, tokenizer.pad_token_id).item()
            for p, c in zip(prompts, completions, strict=True)
        ]
    sums = torch.tensor([g.logprob for g in got])
    torch.testing.assert_close(sums, torch.tensor(alone), atol=1e-4, rtol=0)
    # Each row's tokens, one per completion token, add up to its sum (float32 rounding).
    tokens = [torch.from_numpy(unpack_logprobs(g.token_logprobs).copy()) for g in got]
    assert [len(t) for t in tokens] == [len(c) for c in completions]
    torch.testing.assert_close(torch.stack([t.sum() for t in tokens]), sums, atol=1e-5, rtol=1e-6)


def test_scored_sums_are_sequence_logprobs_bit_for_bit():
    tokenizer, model = load_model(MODEL, 0)
    prompts, completions = [[1, 5, 6], [1, 5, 6], [1, 9]], [[7, 8, 2], [9], [4, 4, 4, 4]]
    got = ReferenceScorer(model, tokenizer.pad_token_id, batch_size=8).score(
        prompts, completions, 0.7
    )
    with torch.inference_mode():
        want = sequence_logprobs(model, prompts, completions, 0.7, tokenizer.pad_token_id)
    assert [g.logprob for g in got] == want.tolist()


def test_a_prompts_completions_all_scored_before_are_looked_up_not_scored_again():
    tokenizer, model = load_model(MODEL, 0)
    scorer = ReferenceScorer(model, tokenizer.pad_token_id, batch_size=8, cache_tokens=7)
    first = scorer.score([[1, 5], [1, 5], [1, 9]], [[7, 2], [7, 2], [4]], 1.0)
    assert not any(r.looked_up for r in first)
    # Changed weights show which rows the model scored: only those not looked up.
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.5)
    again = scorer.score([[1, 9], [1, 5], [1, 5], [1, 6]], [[4], [7, 2], [7, 2], [4]], 1.0)
    assert values(again[:3]) == values([first[2], first[0], first[1]])
    assert [r.looked_up for r in again] == [True, True, True, False]
    fresh = ReferenceScorer(model, tokenizer.pad_token_id, batch_size=8)
    assert values(again[3:]) == values(fresh.score([[1, 6]], [[4]], 1.0))
    # A prompt with one completion not seen before is scored whole (one packed sequence).
    mixed = scorer.score([[1, 6], [1, 6]], [[4], [5, 2]], 1.0)
    assert values(mixed) == values(fresh.score([[1, 6], [1, 6]], [[4], [5, 2]], 1.0))
    # At another temperature it is another value; the cache keeps the 7 tokens used last.
    assert values(scorer.score([[1, 5]], [[7, 2]], 0.7)) != values(first[:1])
    assert values(scorer.score([[1, 9]], [[4]], 1.0)) != values(first[2:])


def test_without_a_cache_every_completion_is_scored():
    tokenizer, model = load_model(MODEL, 0)
    scorer = ReferenceScorer(model, tokenizer.pad_token_id, batch_size=8)
    first = scorer.score([[1, 5], [1, 5]], [[7, 2], [7, 2]], 1.0)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.5)
    again = scorer.score([[1, 5]], [[7, 2]], 1.0)
    assert values(again) != values(first[:1]) and not again[0].looked_up


def values(refs: list[ReferenceLogprobs]) -> list[tuple[float, bytes]]:
    return [(r.logprob, r.token_logprobs) for r in refs]
