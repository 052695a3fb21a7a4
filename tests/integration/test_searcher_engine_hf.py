"""The transformers engine on tiny models: shapes and finish reasons, behaviour log-probs equal
to the trainer's `sequence_logprobs`, seeded reproducibility, and hot-reloading weights
(prepared beside generation, then swapped in)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tba.domain import FinishReason, unpack_logprobs
from tba.errors import InvalidArgumentError
from tba.models.config import ModelSettings
from tba.models.loading import load_model
from tba.models.logprobs import sequence_logprobs
from tba.searcher.config import EngineSettings
from tba.searcher.engine import SamplingParams
from tba.searcher.hf_engine import TransformersEngine

MODEL = ModelSettings(tiny_layers=1, tiny_width=32, tiny_heads=2, tiny_positions=64)
TEXTS = ("12+35=", "1+1=", "99+99=")


def engine_for(seed: int = 0, eos_nats: float = 0.0, chunk: int = 256) -> TransformersEngine:
    """A tiny engine; `eos_nats` raises the EOS logit so that completions stop early."""
    tokenizer, model = load_model(MODEL, seed)
    with torch.no_grad():
        eos = model.transformer.wte.weight[tokenizer.eos_token_id]
        model.transformer.ln_f.bias += eos * (eos_nats / eos.dot(eos))
    settings = EngineSettings(device="cpu", dtype="fp32", max_batch_sequences=chunk)
    return TransformersEngine(model, tokenizer, settings)


def prompts_of(engine: TransformersEngine) -> list[list[int]]:
    return [engine.tokenizer.encode(t) for t in TEXTS]


def params(n: int = 4, max_new_tokens: int = 6, seed: int | None = 3) -> SamplingParams:
    return SamplingParams(n=n, max_new_tokens=max_new_tokens, temperature=0.7, seed=seed)


def test_n_completions_per_prompt_cut_at_the_first_eos():
    engine = engine_for(eos_nats=1.5, chunk=7)  # 3 x 16 rows: several chunks
    eos = engine.tokenizer.eos_token_id
    out = engine.generate(prompts_of(engine), params(n=16))
    assert [len(group) for group in out] == [16, 16, 16]
    flat = [c for group in out for c in group]
    for c in flat:
        assert 1 <= len(c.token_ids) <= 6
        if c.finish_reason == FinishReason.STOP:
            assert c.token_ids[-1] == eos and eos not in c.token_ids[:-1]
        else:
            assert c.finish_reason == FinishReason.LENGTH
            assert len(c.token_ids) == 6 and eos not in c.token_ids
        assert c.text == engine.tokenizer.decode(c.token_ids, skip_special_tokens=True)
    assert {c.finish_reason for c in flat} == {FinishReason.STOP, FinishReason.LENGTH}


@pytest.mark.parametrize("eos_nats", [0.0, 1.5])
def test_behaviour_logprob_equals_sequence_logprobs(eos_nats):
    engine = engine_for(eos_nats=eos_nats, chunk=5)
    prompts = prompts_of(engine)
    out = engine.generate(prompts, params(n=8, max_new_tokens=10))
    rows = [(p, c) for p, group in zip(prompts, out, strict=True) for c in group]
    with torch.no_grad():
        expected = sequence_logprobs(
            engine.model,
            [p for p, _ in rows],
            [c.token_ids for _, c in rows],
            0.7,
            engine.tokenizer.pad_token_id,
        )
    got = torch.tensor([c.behavior_logprob for _, c in rows])
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)
    # Per token: one value per completion token, adding up to the sum in float32.
    for _, c in rows:
        tokens = unpack_logprobs(c.token_logprobs)
        assert len(tokens) == len(c.token_ids)
        assert float(torch.from_numpy(tokens.copy()).sum()) == c.behavior_logprob


def test_the_same_completion_of_other_prompts_keeps_its_own_logprob():
    # EOS made near certain: most rows of every prompt are the one-token completion [EOS],
    # built once per prompt (EOS drawn in 6-8 of 8 rows over seeds 0-5), each with the
    # log-prob under its own prompt.
    engine = engine_for(eos_nats=6.0)
    prompts = prompts_of(engine)
    out = engine.generate(prompts, params(n=8))
    eos = [engine.tokenizer.eos_token_id]
    stopped = [[c for c in group if c.token_ids == eos] for group in out]
    assert all(len(group) >= 2 for group in stopped)
    with torch.no_grad():
        pad = engine.tokenizer.pad_token_id
        expected = sequence_logprobs(engine.model, prompts, [eos] * 3, 0.7, pad)
    for group, logprob in zip(stopped, expected.tolist(), strict=True):
        assert [c.behavior_logprob for c in group] == pytest.approx(
            [logprob] * len(group), abs=1e-4
        )
    assert len({group[0].behavior_logprob for group in stopped}) == 3


def test_seeded_generation_is_reproducible():
    engine = engine_for()
    prompts = prompts_of(engine)
    tokens = [[c.token_ids for c in g] for g in engine.generate(prompts, params(seed=11))]
    again = [[c.token_ids for c in g] for g in engine.generate(prompts, params(seed=11))]
    other = [[c.token_ids for c in g] for g in engine.generate(prompts, params(seed=12))]
    assert tokens == again
    assert tokens != other


def saved(seed: int, folder: Path, settings: ModelSettings = MODEL) -> Path:
    tokenizer, model = load_model(settings, seed)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_hot_reload_swaps_weights_in_place(tmp_path):
    engine = engine_for(seed=0)
    prompts = prompts_of(engine)
    first = engine.generate(prompts, params(seed=5))
    assert engine.version == 0

    engine.load_weights(saved(1, tmp_path / "b"), version=1)
    assert engine.version == 1
    other = engine.generate(prompts, params(seed=5))
    assert [c.token_ids for g in other for c in g] != [c.token_ids for g in first for c in g]

    engine.load_weights(saved(0, tmp_path / "a"), version=2)
    assert engine.version == 2
    back = engine.generate(prompts, params(seed=5))
    assert [c.token_ids for g in back for c in g] == [c.token_ids for g in first for c in g]
    torch.testing.assert_close(
        torch.tensor([c.behavior_logprob for g in back for c in g]),
        torch.tensor([c.behavior_logprob for g in first for c in g]),
    )


def test_prepared_weights_change_nothing_until_swapped_in(tmp_path):
    engine = engine_for(seed=0)
    prompts = prompts_of(engine)
    first = engine.generate(prompts, params(seed=5))
    prepared = engine.prepare_weights(saved(1, tmp_path / "b"))
    assert engine.generate(prompts, params(seed=5)) == first and engine.version == 0

    engine.swap_weights(prepared, version=1)
    model = engine.model
    assert engine.version == 1
    # The output layer stays tied to the embeddings it was saved with.
    assert model.lm_head.weight is model.transformer.wte.weight
    _, expected = load_model(MODEL, 1)
    swapped = model.state_dict()
    for name, tensor in expected.state_dict().items():
        torch.testing.assert_close(swapped[name], tensor, atol=0, rtol=0)


def test_weights_of_another_architecture_are_refused_and_change_nothing(tmp_path):
    engine = engine_for(seed=0)
    prompts = prompts_of(engine)
    before = engine.generate(prompts, params(seed=5))
    wider = MODEL.model_copy(update={"tiny_width": 64})
    with pytest.raises(InvalidArgumentError, match="do not fit"):
        engine.load_weights(saved(1, tmp_path / "wide", wider), version=1)
    with pytest.raises(InvalidArgumentError, match=r"no \.safetensors"):
        engine.load_weights(tmp_path, version=1)
    assert engine.version == 0
    assert engine.generate(prompts, params(seed=5)) == before


def test_bad_requests_are_refused():
    engine = engine_for()
    with pytest.raises(InvalidArgumentError, match="no tokens"):
        engine.generate([[]], params())
    with pytest.raises(InvalidArgumentError, match="context"):
        engine.generate([[5] * 64], params())
    with pytest.raises(InvalidArgumentError, match="temperature"):
        engine.generate(prompts_of(engine), SamplingParams(n=1, max_new_tokens=2, temperature=0))
