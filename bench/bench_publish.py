"""Weight publishing: publish + reload of a ~100M-parameter model through `file://` and
through a real SeaweedFS S3 server, beside a raw safetensors save + load of the same tensors
in the same run. Target: publish + reload within 1.5x of raw.

Publish is `publish_weights` (save_pretrained files, sha256 of each, manifest, LATEST,
retention); reload is `fetch_weights` (download, verify every sha256) and loading the
safetensors into the model, as a searcher does. `--quick` uses a ~3M-parameter model.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from bench.common import Row
from tba.models.tiny import build_tiny_tokenizer
from tba.objectstore import ObjectStore, open_store
from tba.objectstore.local import FileStore
from tba.objectstore.weights import fetch_weights, publish_weights
from tests.fixtures.seaweedfs import running_seaweedfs, store_settings

TARGET_RATIO = 1.5


def _model(quick: bool) -> Any:
    from transformers import GPT2Config, GPT2LMHeadModel

    tokenizer = build_tiny_tokenizer()
    layers, width = (2, 256) if quick else (14, 768)
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=1024,
        n_embd=width,
        n_layer=layers,
        n_head=max(width // 64, 1),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return GPT2LMHeadModel(config), tokenizer


def _unique_tensors(model: Any) -> dict[str, torch.Tensor]:
    """The tensors save_pretrained writes: tied weights once."""
    seen: set[int] = set()
    tensors = {}
    for name, tensor in model.state_dict().items():
        if tensor.data_ptr() not in seen:
            seen.add(tensor.data_ptr())
            tensors[name] = tensor.contiguous()
    return tensors


def _load_into(model: Any, path: Path) -> None:
    model.load_state_dict(load_file(path), strict=False)


def _raw(model: Any, folder: Path) -> float:
    path = folder / "raw.safetensors"
    started = time.perf_counter()
    save_file(_unique_tensors(model), path, metadata={"format": "pt"})
    _load_into(model, path)
    elapsed = time.perf_counter() - started
    path.unlink()
    return elapsed


def _through_store(
    store: ObjectStore, version: int, model: Any, tokenizer: Any, folder: Path
) -> tuple[float, float]:
    started = time.perf_counter()
    weights = publish_weights(store, version, version, model, tokenizer, keep_last=1)
    published = time.perf_counter()
    local = fetch_weights(store, weights, folder / f"fetched-{version}")
    _load_into(model, local / "model.safetensors")
    return published - started, time.perf_counter() - published


def _compare(
    case: str, store: ObjectStore, model: Any, tokenizer: Any, root: Path, repeats: int
) -> list[Row]:
    """Medians of raw, publish and reload, interleaved so that drift (page cache writeback
    on these machines) hits both alike."""
    raws, publishes, reloads = [], [], []
    folder = root / case.split(":")[0]
    for version in range(1, repeats + 1):
        raws.append(_raw(model, root))
        publish_s, reload_s = _through_store(store, version, model, tokenizer, folder)
        publishes.append(publish_s)
        reloads.append(reload_s)
    raw_s = statistics.median(raws)
    rows = [Row("publish", f"raw safetensors save + load (beside {case})", raw_s, "s")]
    return rows + _rows(case, raw_s, statistics.median(publishes), statistics.median(reloads))


def _rows(case: str, raw_s: float, publish_s: float, reload_s: float) -> list[Row]:
    total = publish_s + reload_s
    ratio = total / raw_s
    return [
        Row("publish", f"{case} publish", publish_s, "s"),
        Row("publish", f"{case} reload (fetch + verify + load)", reload_s, "s"),
        Row(
            "publish",
            f"{case} publish + reload",
            total,
            "s",
            baseline=raw_s,
            ratio=ratio,
            target=f"<= {TARGET_RATIO}x raw safetensors save + load",
            passed=ratio <= TARGET_RATIO,
        ),
    ]


def run(quick: bool) -> list[Row]:
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    model, tokenizer = _model(quick)
    params = sum(p.numel() for p in model.parameters())
    repeats = 1 if quick else 3
    rows = [Row("publish", "model parameters", params / 1e6, "M")]
    with tempfile.TemporaryDirectory(prefix="tba-bench-publish-") as tmp:
        root = Path(tmp)
        file_store = FileStore(f"file://{root / 'store'}")
        rows += _compare("file://", file_store, model, tokenizer, root, repeats)
        (root / "weed").mkdir()
        with running_seaweedfs(root / "weed") as server:
            s3_store = open_store(store_settings(server))
            rows += _compare("s3:// SeaweedFS", s3_store, model, tokenizer, root, repeats)
    return rows
