"""Weight publishing: publish + reload of a ~100M-parameter model through `file://` and
through a real SeaweedFS S3 server, beside a raw safetensors save + load of the same tensors
in the same run. Target: publish + reload within 1.5x of raw.

Publish is `publish_weights` (save_pretrained files, sha256 of each, manifest, LATEST,
retention); reload is `fetch_weights` (download, verify every sha256) and loading the
safetensors into the model, as a searcher does. `--quick` uses a ~3M-parameter model.

Where the S3 time goes: the same steps one at a time (serialize, sha256, upload, download,
verify, load; publish runs its sha256 beside the upload), the CPU seconds of this process and
of the SeaweedFS server per publish + reload (they share this machine's cores), and a plain
HTTP PUT of the same file to the SeaweedFS filer (no S3 gateway, no signing, no SDK): the
server's own floor for storing those bytes.

Then the trainer loop with publishing every step against publishing off (`bench.publish_loop`).
"""

from __future__ import annotations

import http.client
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from bench import publish_loop
from bench.common import Row, gpt2_100m, proc_stat
from tba.objectstore import ObjectStore, open_object_store
from tba.objectstore.local import FileStore
from tba.objectstore.weights import fetch_weights, publish_weights, sha256_file
from tests.fixtures.seaweedfs import SeaweedServer, store_settings

TARGET_RATIO = 1.5
_PHASE_KEY = "bench/model.safetensors"
_HTTP_BLOCK_BYTES = 1024 * 1024
_RAW_TRANSFER_STEPS = ("serialize (save_pretrained)", "upload", "download", "load")


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


def _cpu_s(pid: int | None) -> float:
    """CPU seconds used so far by process `pid` (all its threads), or by this one if None."""
    return time.process_time() if pid is None else proc_stat(pid).cpu_s


def _through_store(
    store: ObjectStore, version: int, model: Any, tokenizer: Any, folder: Path, pid: int | None
) -> dict[str, float]:
    """One publish + reload: wall seconds of each, CPU seconds of this process and of the
    server (`pid`, when there is one) over both."""
    cpu, server_cpu = _cpu_s(None), _cpu_s(pid) if pid else 0.0
    started = time.perf_counter()
    weights = publish_weights(store, version, version, model, tokenizer, keep_last=1)
    published = time.perf_counter()
    local = fetch_weights(store, weights, folder / f"fetched-{version}")
    _load_into(model, local / "model.safetensors")
    sample = {
        "publish": published - started,
        "reload": time.perf_counter() - published,
        "client cpu": _cpu_s(None) - cpu,
    }
    if pid:
        sample["server cpu"] = _cpu_s(pid) - server_cpu
    return sample


def _timed(timings: dict[str, float], name: str, step: Callable[[], object]) -> None:
    started = time.perf_counter()
    step()
    timings[name] = time.perf_counter() - started


def _plain_http_put(url: str, path: Path) -> None:
    """PUTs the file to a plain HTTP endpoint (the SeaweedFS filer), streamed in 1 MiB blocks."""
    host, _, port = url.removeprefix("http://").partition(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=300, blocksize=_HTTP_BLOCK_BYTES)
    try:
        with path.open("rb") as body:
            length = {"Content-Length": str(path.stat().st_size)}  # else it goes chunked
            conn.request("PUT", "/bench/plain.safetensors", body=body, headers=length)
            response = conn.getresponse()
            response.read()
    finally:
        conn.close()
    if response.status >= 300:
        raise RuntimeError(f"plain PUT to {url} answered {response.status}")


def _phases(
    store: ObjectStore, model: Any, folder: Path, filer_url: str | None
) -> dict[str, float]:
    """The steps of publish and reload one at a time, on the weights file alone."""
    staging, target = folder / "phases", folder / "phase-download.safetensors"
    timings: dict[str, float] = {}
    _timed(timings, "serialize (save_pretrained)", lambda: model.save_pretrained(staging))
    path = staging / "model.safetensors"
    _timed(timings, "sha256", lambda: sha256_file(path))
    _timed(timings, "upload", lambda: store.put_file(_PHASE_KEY, path))
    _timed(timings, "download", lambda: store.get_file(_PHASE_KEY, target))
    _timed(timings, "verify (sha256)", lambda: sha256_file(target))
    _timed(timings, "load", lambda: _load_into(model, target))
    if filer_url:
        _timed(timings, "plain HTTP PUT to the filer", lambda: _plain_http_put(filer_url, path))
    store.delete(_PHASE_KEY)
    target.unlink()
    shutil.rmtree(staging)
    return timings


def _medians(samples: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(s[key] for s in samples) for key in samples[0]}


def _compare(
    case: str,
    store: ObjectStore,
    model: Any,
    tokenizer: Any,
    root: Path,
    repeats: int,
    server: SeaweedServer | None = None,
) -> list[Row]:
    """Medians of raw, publish and reload (and, through a server, of the steps alone),
    interleaved so that drift (page cache writeback on these machines) hits all alike."""
    folder = root / case.split(":")[0]
    pid = server.proc.pid if server and server.proc else None
    filer_url = f"http://127.0.0.1:{server.ports['filer.port']}" if server else None
    raws, runs, phases = [], [], []
    for version in range(1, repeats + 1):
        raws.append(_raw(model, root))
        runs.append(_through_store(store, version, model, tokenizer, folder, pid))
        if server:
            phases.append(_phases(store, model, folder, filer_url))
    raw_s = statistics.median(raws)
    run = _medians(runs)
    rows = [Row("publish", f"raw safetensors save + load (beside {case})", raw_s, "s")]
    rows += _rows(case, raw_s, run)
    if phases:
        rows += [Row("publish", f"{case} step: {k}", v, "s") for k, v in _medians(phases).items()]
        rows.append(_raw_transfer_row(case, run["publish"] + run["reload"], phases))
    return rows


def _raw_transfer_row(case: str, total_s: float, phases: list[dict[str, float]]) -> Row:
    """Publish + reload against the same weights moved raw through the same server (save,
    upload, download, load; no hashing, manifest, pointer or retention): what publishing adds
    over the transfer itself, apart from the server's own cost."""
    transfer_s = statistics.median(sum(p[k] for k in _RAW_TRANSFER_STEPS) for p in phases)
    return _target_row(
        f"{case} publish + reload vs raw transfer through the server",
        total_s,
        transfer_s,
        "save + upload + download + load",
    )


def _target_row(case: str, total_s: float, baseline_s: float, baseline: str) -> Row:
    """Publish + reload seconds against a baseline's, with the 1.5x target."""
    ratio = total_s / baseline_s
    return Row(
        "publish",
        case,
        total_s,
        "s",
        baseline=baseline_s,
        ratio=ratio,
        target=f"<= {TARGET_RATIO}x {baseline}",
        passed=ratio <= TARGET_RATIO,
    )


def _rows(case: str, raw_s: float, run: dict[str, float]) -> list[Row]:
    total = run["publish"] + run["reload"]
    rows = [
        Row("publish", f"{case} publish", run["publish"], "s"),
        Row("publish", f"{case} reload (fetch + verify + load)", run["reload"], "s"),
        _target_row(f"{case} publish + reload", total, raw_s, "raw safetensors save + load"),
        Row("publish", f"{case} client CPU per publish + reload", run["client cpu"], "cpu-s"),
    ]
    if "server cpu" in run:
        rows.append(
            Row("publish", f"{case} server CPU per publish + reload", run["server cpu"], "cpu-s")
        )
    return rows


def run(quick: bool) -> list[Row]:
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    model, tokenizer = gpt2_100m(quick, n_positions=1024)
    params = sum(p.numel() for p in model.parameters())
    repeats = 1 if quick else 3
    rows = [Row("publish", "model parameters", params / 1e6, "M")]
    with tempfile.TemporaryDirectory(prefix="tba-bench-publish-") as tmp:
        root = Path(tmp)
        file_store = FileStore(f"file://{root / 'store'}")
        rows += _compare("file://", file_store, model, tokenizer, root, repeats)
        (root / "weed").mkdir()
        server = SeaweedServer(root / "weed")
        try:
            server.start()
            s3_store = open_object_store(store_settings(server.s3))
            rows += _compare("s3:// SeaweedFS", s3_store, model, tokenizer, root, repeats, server)
        finally:
            server.kill()
    return rows + publish_loop.run(quick)
