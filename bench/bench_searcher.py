"""Searcher throughput: completion tokens/s of each engine bare (`engine.generate` in a loop)
and inside the searcher loop (lease from a real buffer service in a subprocess with the memory
store, reward, reference log-probs, AddTrajectories), in the same run on the same engine.
Bare and loop rounds alternate so that drift hits both alike. Target: loop / bare >= 0.90.
A third row leaves out the loop's reference phase (one forward pass of the base model over
every completion, work that bare generation does not do), to show what the rest of the loop
(lease, reward, posting, weight checks) costs.

The vLLM engine is included when `import vllm` works. `--quick` uses the 3-layer demo model;
the full run a 6-layer, 256-wide one with longer completions.
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from bench.common import Row
from tba.buffer.config import BufferClientSettings
from tba.models.config import ModelSettings
from tba.objectstore.config import ObjectStoreSettings
from tba.searcher.config import EngineSettings, SearcherSettings
from tba.searcher.engine import SamplingParams
from tba.searcher.main import Searcher, SearcherRunSettings, build_searcher
from tba.tasks.base import Split
from tba.tasks.config import TaskSettings
from tba.tasks.registry import build_task
from tests.fixtures.buffer_service import start_buffer

TARGET_RATIO = 0.90


def _settings(kind: str, address: str, root: Path, quick: bool) -> SearcherRunSettings:
    layers, width, new_tokens, samples = (3, 128, 32, 8) if quick else (6, 256, 128, 16)
    return SearcherRunSettings(
        searcher=SearcherSettings(
            id=f"bench-{kind}",
            prompts_per_round=8,
            samples_per_prompt=samples,
            max_new_tokens=new_tokens,
            weights_dir=str(root / f"weights-{kind}"),
        ),
        engine=EngineSettings(kind=kind, device="cpu", enforce_eager=True),
        model=ModelSettings(tiny_layers=layers, tiny_width=width, tiny_positions=256),
        task=TaskSettings(),
        client=BufferClientSettings(address=address),
        objectstore=ObjectStoreSettings(uri=f"file://{root / 'store'}"),
    )


def _bare_round(searcher: Searcher, prompts: list[list[int]], seed: int) -> tuple[int, float]:
    s = searcher.loop.settings
    params = SamplingParams(s.samples_per_prompt, s.max_new_tokens, s.temperature, s.top_p, seed)
    started = time.perf_counter()
    out = searcher.engine.generate(prompts, params)
    return sum(len(c.token_ids) for group in out for c in group), time.perf_counter() - started


def _loop_round(searcher: Searcher) -> tuple[int, float, float]:
    started = time.perf_counter()
    values = searcher.loop.round()
    elapsed = time.perf_counter() - started
    assert values is not None, "the buffer had no free prompt"
    return int(values["searcher/tokens"]), elapsed, values["searcher/reference_s"]


def _compare(kind: str, address: str, root: Path, quick: bool) -> list[Row]:
    settings = _settings(kind, address, root, quick)
    searcher = build_searcher(settings)
    try:
        tokenizer: Any = searcher.loop.tokenizer
        task = build_task(settings.task)
        texts = [p.text for p in task.prompts(Split.TRAIN)]
        per_round = settings.searcher.prompts_per_round
        rounds = 4 if quick else 10
        # tokens, seconds (bare, loop), and seconds of the loop's reference phase
        totals = [0, 0.0, 0, 0.0, 0.0]
        for r in range(rounds + 1):
            batch = [tokenizer.encode(t) for t in texts[r * per_round : (r + 1) * per_round]]
            measured = [*_bare_round(searcher, batch, r), *_loop_round(searcher)]
            if r > 0:  # round 0 warms up
                totals = [a + b for a, b in zip(totals, measured, strict=True)]
    finally:
        searcher.close()
    bare = totals[0] / totals[1]
    loop = totals[2] / totals[3]
    without_reference = totals[2] / (totals[3] - totals[4])
    return [
        Row("searcher", f"{kind} bare generate", bare, "tokens/s"),
        Row(
            "searcher",
            f"{kind} inside the searcher loop",
            loop,
            "tokens/s",
            baseline=bare,
            ratio=loop / bare,
            target=f">= {TARGET_RATIO} x bare generate",
            passed=loop / bare >= TARGET_RATIO,
        ),
        Row(
            "searcher",
            f"{kind} loop less its reference phase",
            without_reference,
            "tokens/s",
            baseline=bare,
            ratio=without_reference / bare,
        ),
    ]


def run(quick: bool) -> list[Row]:
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    kinds = ["transformers"]
    if importlib.util.find_spec("vllm") is not None:
        kinds.append("vllm")
    else:
        print("vllm is not installed: the vllm engine is skipped", flush=True)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="tba-bench-searcher-") as tmp:
        root = Path(tmp)
        service = start_buffer(root)
        try:
            for kind in kinds:
                rows += _compare(kind, service.address, root, quick)
        finally:
            service.stop()
    return rows
