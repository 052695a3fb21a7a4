"""Sequence log-probs with completions of a prompt packed into one sequence: values and
gradients equal those of each (prompt, completion) run alone through the model, under SDPA
and eager attention, whatever the order of rows and however sequences are cut."""

from __future__ import annotations

import random

import pytest
import torch

from tba.models.config import ModelSettings
from tba.models.loading import load_model
from tba.models.logprobs import (
    distinct_rows,
    pack_shared_prompts,
    plan_sequences,
    sequence_logprobs,
    token_logprobs,
)

MODEL = ModelSettings(tiny_layers=2, tiny_width=32, tiny_heads=2, tiny_positions=128)
TEMPERATURE = 0.7


def _alone_tokens(
    model, prompt: list[int], completion: list[int], temperature: float = TEMPERATURE
) -> torch.Tensor:
    """The plain definition: one unpadded causal pass, log-softmax of each completion token."""
    ids = torch.tensor([[*prompt, *completion]])
    logits = model(input_ids=ids, use_cache=False).logits[0, :-1].float() / temperature
    logprobs = torch.log_softmax(logits, dim=-1)
    targets = ids[0, 1:]
    picked = logprobs[torch.arange(targets.numel()), targets]
    return picked[len(prompt) - 1 :]


def _alone(model, prompt: list[int], completion: list[int]) -> torch.Tensor:
    return _alone_tokens(model, prompt, completion).sum()


def _groups(seed: int) -> tuple[list[list[int]], list[list[int]]]:
    rng = random.Random(seed)
    prompts, completions = [], []
    for _ in range(7):
        prompt = [1, *rng.choices(range(4, 40), k=rng.randrange(0, 8))]
        for _ in range(rng.randrange(1, 6)):
            prompts.append(prompt)
            completions.append(rng.choices(range(4, 40), k=rng.randrange(1, 12)))
    order = list(range(len(prompts)))
    rng.shuffle(order)
    return [prompts[i] for i in order], [completions[i] for i in order]


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_values_and_gradients_equal_each_completion_run_alone(attention):
    tokenizer, model = load_model(MODEL, 0)
    model.config._attn_implementation = attention
    prompts, completions = _groups(0)
    packed = sequence_logprobs(model, prompts, completions, TEMPERATURE, tokenizer.pad_token_id)
    alone = torch.stack([_alone(model, p, c) for p, c in zip(prompts, completions, strict=True)])
    torch.testing.assert_close(packed, alone, atol=1e-4, rtol=0)
    weights = torch.linspace(0.5, 1.5, len(prompts))
    params = list(model.parameters())
    got = torch.autograd.grad((packed * weights).sum(), params)
    want = torch.autograd.grad((alone * weights).sum(), params)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-4)


def test_a_prompt_is_packed_once_with_its_completions():
    prompts = [[1, 5, 6, 7]] * 3 + [[1, 9]]
    completions = [[10, 11], [12], [13, 14, 15], [16]]
    batch = pack_shared_prompts(prompts, completions, pad_token_id=0)
    # [1 5 6] once, then 7+[10], 7, 7+[13 14] (a completion's last token is only a target).
    assert batch.input_ids.tolist()[0] == [1, 5, 6, 7, 10, 7, 7, 13, 14]
    assert batch.position_ids.tolist()[0] == [0, 1, 2, 3, 4, 3, 3, 4, 5]
    assert batch.input_ids.tolist()[1] == [1, 9, 0, 0, 0, 0, 0, 0, 0]
    assert batch.target_token.tolist() == [10, 11, 12, 13, 14, 15, 16]
    assert batch.target_row.tolist() == [0, 0, 1, 2, 2, 2, 3]
    # The second completion's token sees the prompt and itself, not the first completion.
    assert batch.attention[0, 0, 5].tolist() == [True] * 3 + [False] * 2 + [True] + [False] * 3


def test_long_completions_of_a_short_prompt_are_packed_only_where_it_costs_less():
    tokenizer, model = load_model(MODEL, 0)
    prompts = [[1, 4, 5]] * 9
    long = [[6 + i] * 10 for i in range(9)]
    pad = tokenizer.pad_token_id
    assert pack_shared_prompts(prompts, long, pad).input_ids.shape[0] == 1
    # Width 32: a second 10-token completion after 2 prompt tokens is cheaper joined (4,520
    # multiply-adds / d against 4,896 alone), a third is not (4,920)...
    assert [len(r) for r in plan_sequences(prompts, long, 32)] == [2, 2, 2, 2, 1]
    # ...but 5 sequences padded to 22 tokens cost more than 9 rows of 12 (47,080 / 44,064).
    assert pack_shared_prompts(prompts, long, pad, hidden_size=32).input_ids.shape == (9, 12)
    # Short completions of the same prompt share one sequence at any width.
    short = [[6 + i] for i in range(9)]
    assert pack_shared_prompts(prompts, short, pad, hidden_size=32).input_ids.shape == (1, 11)
    got = sequence_logprobs(model, prompts, long, TEMPERATURE, pad)
    want = torch.stack([_alone(model, p, c) for p, c in zip(prompts, long, strict=True)])
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)


def test_a_plan_holds_at_most_max_rows_a_sequence_and_plans_again_the_same():
    prompts = [[1, 4]] * 5 + [[1, 5]] * 2
    completions = [[6]] * 7
    capped = [[0, 1], [2, 3], [4], [5, 6]]
    assert plan_sequences(prompts, completions, 32, max_rows=2) == capped
    again = [row for rows in capped for row in rows]
    assert plan_sequences([prompts[r] for r in again], completions, 32, max_rows=2) == capped
    assert plan_sequences(prompts, completions, 32) == [[0, 1, 2, 3, 4], [5, 6]]


@pytest.mark.parametrize(
    ("prompts", "completions", "temperature", "message"),
    [
        ([[1]], [[2], [3]], 1.0, "differ in number"),
        ([[1]], [[]], 1.0, "at least one token"),
        ([[]], [[2]], 1.0, "at least one token"),
        ([[1]], [[2]], 0.0, "temperature"),
        ([[1], [1]], [[2], [3]], torch.tensor([0.7, 0.0]), "temperature"),
    ],
)
def test_bad_input_is_refused(prompts, completions, temperature, message):
    tokenizer, model = load_model(MODEL, 0)
    with pytest.raises(ValueError, match=message):
        sequence_logprobs(model, prompts, completions, temperature, tokenizer.pad_token_id)


def test_token_logprobs_are_each_rows_tokens_in_order_and_sum_to_the_sequence():
    tokenizer, model = load_model(MODEL, 0)
    prompts, completions = _groups(0)
    pad = tokenizer.pad_token_id
    with torch.no_grad():
        tokens = token_logprobs(model, prompts, completions, TEMPERATURE, pad)
        per_row = tokens.per_row()
        for got, p, c in zip(per_row, prompts, completions, strict=True):
            torch.testing.assert_close(got, _alone_tokens(model, p, c), atol=1e-4, rtol=0)
        # The sequence sums are those of `sequence_logprobs` bit for bit, as before.
        sums = sequence_logprobs(model, prompts, completions, TEMPERATURE, pad)
    assert torch.equal(tokens.sums(), sums)
    assert [len(r) for r in per_row] == [len(c) for c in completions]


def test_each_row_may_have_its_own_temperature():
    """Two completions of one prompt (one packed sequence) at 0.5 and 1.7: each row's values
    are those of the row alone at its temperature, by the plain definition."""
    tokenizer, model = load_model(MODEL, 0)
    prompts, completions = [[1, 5, 6], [1, 5, 6]], [[7, 8, 9], [10, 11]]
    temperatures = torch.tensor([0.5, 1.7])
    with torch.no_grad():
        both = token_logprobs(model, prompts, completions, temperatures, tokenizer.pad_token_id)
        rows = zip(both.per_row(), prompts, completions, [0.5, 1.7], strict=True)
        for i, (got, p, c, t) in enumerate(rows):
            torch.testing.assert_close(got, _alone_tokens(model, p, c, t), atol=1e-5, rtol=0)
            alone = sequence_logprobs(model, [p], [c], t, tokenizer.pad_token_id)
            torch.testing.assert_close(both.sums()[i : i + 1], alone)
    assert both.sums()[0] != both.sums()[1]


def test_a_temperature_per_row_equal_for_all_gives_the_floats_values_bit_for_bit():
    tokenizer, model = load_model(MODEL, 0)
    prompts, completions = _groups(1)
    pad = tokenizer.pad_token_id
    rows = torch.full((len(prompts),), TEMPERATURE)
    with torch.no_grad():
        one = token_logprobs(model, prompts, completions, TEMPERATURE, pad)
        each = token_logprobs(model, prompts, completions, rows, pad)
    assert torch.equal(one.values, each.values)


def test_identical_rows_are_scored_once_with_each_copys_value_and_gradient():
    """Copies of a row (same prompt, completion and temperature) run through the model once;
    every copy gets the row's values, and the gradient is that of scoring every copy."""
    tokenizer, model = load_model(MODEL, 0)
    prompts = [[1, 5, 6], [1, 5, 6], [1, 5, 6], [1, 7], [1, 5, 6], [1, 7]]
    completions = [[7, 8], [9], [7, 8], [7, 8], [7, 8], [7, 8]]
    temperatures = torch.tensor([0.7, 0.7, 0.7, 0.7, 1.3, 0.7])
    assert distinct_rows(prompts, completions, temperatures) == ([0, 1, 3, 4], [0, 1, 0, 2, 3, 2])
    fed: list[int] = []
    hook = model.transformer.register_forward_hook(
        lambda _m, _a, out: fed.append(int(out.last_hidden_state.shape[0]))
    )
    scored = token_logprobs(model, prompts, completions, temperatures, tokenizer.pad_token_id)
    hook.remove()
    pairs = zip(prompts, completions, temperatures.tolist(), strict=True)
    alone = [_alone_tokens(model, p, c, t) for p, c, t in pairs]
    for got, want in zip(scored.per_row(), alone, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    # One pass over the 4 distinct rows: 2 packed sequences, one per prompt.
    assert fed == [2]
    weights = torch.linspace(0.5, 1.5, len(prompts))
    params = list(model.parameters())
    got = torch.autograd.grad((scored.sums() * weights).sum(), params)
    want = torch.autograd.grad((torch.stack([a.sum() for a in alone]) * weights).sum(), params)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-4)
