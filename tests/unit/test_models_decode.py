"""decode: the KV-cached decoding loop draws what transformers' `generate` draws, reads the
log-probs of the distribution it drew from, runs each distinct context still going once, and
cuts to the nucleus."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import GenerationConfig

from tba.models.decode import decode, nucleus
from tba.models.generate import padded
from tba.models.tiny import build_tiny_model, build_tiny_tokenizer

PROMPTS = [[5, 6, 7, 8], [9], [10, 11]]


@pytest.fixture(scope="module")
def lm():
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(tokenizer, n_layer=2, n_embd=32, n_head=2, n_positions=64, seed=3)
    return tokenizer, model.eval()


def _reference(model, tokenizer, n, temperature, top_p, seed):
    """transformers' own sampling of every row from its whole prompt."""
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    model.generation_config = GenerationConfig(eos_token_id=[eos], pad_token_id=pad)
    inputs = padded(PROMPTS, pad, left=True, device=torch.device("cpu"))
    torch.manual_seed(seed)
    out = model.generate(
        input_ids=inputs["input_ids"].repeat_interleave(n, dim=0),
        attention_mask=inputs["attention_mask"].repeat_interleave(n, dim=0),
        do_sample=True,
        temperature=temperature,
        top_k=0,
        top_p=top_p,
        max_new_tokens=6,
        return_dict_in_generate=True,
        output_scores=True,
    )
    tokens = out.sequences[:, inputs["input_ids"].shape[1] :]
    logprobs = torch.stack(
        [
            s.float().log_softmax(-1).gather(-1, tokens[:, i : i + 1])[:, 0]
            for i, s in enumerate(out.scores)
        ],
        dim=1,
    )
    return tokens, logprobs


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.7, 0.9)])
def test_sampling_draws_what_generate_draws(lm, temperature, top_p):
    tokenizer, model = lm
    want_tokens, want_logprobs = _reference(model, tokenizer, 4, temperature, top_p, seed=11)
    inputs = padded(PROMPTS, tokenizer.pad_token_id, left=True, device=torch.device("cpu"))
    torch.manual_seed(11)
    with torch.no_grad():
        got = decode(
            model,
            inputs,
            n=4,
            max_new_tokens=6,
            temperature=temperature,
            top_p=top_p,
            eos_ids=[tokenizer.eos_token_id],
            pad_id=tokenizer.pad_token_id,
        )
    assert torch.equal(got.tokens, want_tokens)
    live = torch.ones_like(want_tokens, dtype=torch.bool)
    for row in range(len(live)):  # after a row's EOS its log-probs mean nothing
        ends = (want_tokens[row] == tokenizer.eos_token_id).nonzero()
        if len(ends):
            live[row, int(ends[0]) + 1 :] = False
    assert torch.allclose(got.logprobs[live], want_logprobs[live], atol=1e-5)


def test_greedy_takes_the_argmax_and_rows_that_ended_are_padded(lm):
    tokenizer, model = lm
    eos = tokenizer.eos_token_id
    inputs = padded(PROMPTS, tokenizer.pad_token_id, left=True, device=torch.device("cpu"))
    with torch.no_grad():
        got = decode(
            model,
            inputs,
            n=1,
            max_new_tokens=8,
            temperature=0.0,
            eos_ids=[eos],
            pad_id=tokenizer.pad_token_id,
        )
        for row, prompt in enumerate(PROMPTS):
            ids = list(prompt)
            for step, token in enumerate(got.tokens[row].tolist()):
                want = int(model(torch.tensor([ids])).logits[0, -1].argmax())
                assert token == want
                if want == eos:
                    assert set(got.tokens[row, step + 1 :].tolist()) <= {tokenizer.pad_token_id}
                    break
                ids.append(want)


def test_the_prefill_computes_no_logits_beyond_the_last_position(lm, monkeypatch):
    tokenizer, model = lm
    widths = []
    forward = model.forward

    def recording(*args, **kwargs):
        out = forward(*args, **kwargs)
        widths.append(out.logits.shape[1])
        return out

    monkeypatch.setattr(model, "forward", recording)
    inputs = padded(PROMPTS, tokenizer.pad_token_id, left=True, device=torch.device("cpu"))
    with torch.no_grad():
        decode(
            model,
            inputs,
            n=2,
            max_new_tokens=3,
            temperature=1.0,
            eos_ids=[tokenizer.eos_token_id],
            pad_id=tokenizer.pad_token_id,
        )
    assert widths and set(widths) == {1}


@pytest.mark.parametrize(
    ("n", "temperature", "eos_nats"), [(4, 1.0, 3.0), (3, 0.0, 0.0), (8, 0.5, 1.0)]
)
def test_each_forward_runs_the_distinct_contexts_still_going(monkeypatch, n, temperature, eos_nats):
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(tokenizer, n_layer=2, n_embd=32, n_head=2, n_positions=64, seed=3)
    eos = tokenizer.eos_token_id
    with torch.no_grad():  # EOS `eos_nats` likelier, so that rows end at different steps
        eos_row = model.transformer.wte.weight[eos]
        model.transformer.ln_f.bias += eos_row * (eos_nats / eos_row.dot(eos_row))
    rows_run: list[int] = []
    forward = model.forward

    def recording(*args, **kwargs):
        rows_run.append(kwargs["input_ids"].shape[0])
        return forward(*args, **kwargs)

    monkeypatch.setattr(model, "forward", recording)
    inputs = padded(PROMPTS, tokenizer.pad_token_id, left=True, device=torch.device("cpu"))
    torch.manual_seed(5)
    with torch.no_grad():
        got = decode(
            model.eval(),
            inputs,
            n=n,
            max_new_tokens=6,
            temperature=temperature,
            eos_ids=[eos],
            pad_id=tokenizer.pad_token_id,
        )
    rows = got.tokens.tolist()
    going = [
        {(r // n, tuple(row[:step])) for r, row in enumerate(rows) if eos not in row[:step]}
        for step in range(1, len(rows[0]))
    ]
    assert rows_run == [len(PROMPTS)] + [len(contexts) for contexts in going]


def test_nucleus_keeps_the_smallest_set_reaching_top_p():
    scores = torch.tensor([[math.log(p) for p in (0.15, 0.5, 0.05, 0.3)]])
    kept = lambda top_p: torch.isfinite(nucleus(scores, top_p))[0].tolist()  # noqa: E731
    assert kept(0.5) == [False, True, False, False]
    assert kept(0.8) == [False, True, False, True]
    assert kept(0.81) == [True, True, False, True]
    assert kept(0.01) == [False, True, False, False]  # the most likely token always stays
    assert kept(1.0) == [True, True, True, True]
