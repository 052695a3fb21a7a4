"""Publishing in the background: the newest-only worker (a waiting item replaced and counted,
one in flight), and StorePublisher with a publisher thread over a real file:// store held
mid-upload: the snapshot is what is published whatever the model does meanwhile, a newer
snapshot replaces a waiting one (skipped, versions stay dense), a publish that fails after its
retries is counted and the next snapshot takes its version number, the files go before the
manifest and the manifest before LATEST; and the export dtype: bf16 files of half the bytes
that from_pretrained loads as bf16."""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from tba.domain import WeightVersion
from tba.errors import UnavailableError
from tba.models.tiny import build_tiny_model, build_tiny_tokenizer
from tba.objectstore.local import FileStore
from tba.objectstore.weights import LATEST, MANIFEST, fetch_weights, list_versions, read_latest
from tba.trainer.config import OptimSettings
from tba.trainer.engine import LocalEngine
from tba.trainer.publish import StorePublisher, take_snapshot
from tba.trainer.publish_worker import NewestOnlyWorker

WAIT_S = 30.0


def test_a_newer_item_replaces_the_waiting_one_and_is_counted():
    started, release = threading.Event(), threading.Event()
    handled: list[int] = []

    def handle(item: int) -> None:
        started.set()
        assert release.wait(WAIT_S)
        handled.append(item)

    worker: NewestOnlyWorker[int] = NewestOnlyWorker(handle, "test-worker")
    worker.submit(1)
    assert started.wait(WAIT_S)  # 1 in flight
    for item in (2, 3, 4):  # 2 waits, 3 replaces it, 4 replaces 3
        worker.submit(item)
    assert worker.skipped == 2
    release.set()
    worker.drain()
    assert handled == [1, 4]
    worker.close()


def test_an_error_the_handler_lets_out_is_raised_in_the_caller():
    def handle(item: int) -> None:
        raise ValueError(f"bug on {item}")

    worker: NewestOnlyWorker[int] = NewestOnlyWorker(handle, "test-worker")
    worker.submit(1)
    with pytest.raises(RuntimeError, match="publisher thread failed") as caught:
        worker.drain()
    assert isinstance(caught.value.__cause__, ValueError)
    worker.close()


class GatedStore(FileStore):
    """A real file store that records the keys it writes and can hold every write until
    released, or fail the next `down_calls` calls as unreachable."""

    def __init__(self, uri: str) -> None:
        super().__init__(uri)
        self.writes: list[str] = []
        self.open = threading.Event()
        self.open.set()
        self.holding = threading.Event()
        self.down_calls = 0

    def _gate(self, key: str) -> None:
        if not self.open.is_set():
            self.holding.set()
            assert self.open.wait(WAIT_S)
        if self.down_calls > 0:
            self.down_calls -= 1
            raise UnavailableError(f"store unreachable ({key})")
        self.writes.append(key)

    def put_bytes(self, key: str, data: bytes) -> None:
        self._gate(key)
        super().put_bytes(key, data)

    def put_file(self, key: str, path: Path) -> None:
        self._gate(key)
        super().put_file(key, path)

    def get_bytes(self, key: str) -> bytes:
        if self.down_calls > 0:
            self._gate(key)
        return super().get_bytes(key)


def tiny_engine(width: int = 16) -> tuple[LocalEngine, object]:
    tokenizer = build_tiny_tokenizer("0123456789+=")
    model = build_tiny_model(tokenizer, n_layer=1, n_embd=width, n_head=2, seed=1)
    return LocalEngine(model, OptimSettings(), total_steps=1), tokenizer


def background_publisher(
    store: FileStore,
    announced: list[WeightVersion],
    retries: int = 0,
    width: int = 16,
    **kwargs: object,
) -> StorePublisher:
    engine, tokenizer = tiny_engine(width)
    return StorePublisher(
        store,
        engine,
        tokenizer,
        announced.append,
        keep_versions=5,
        retries=retries,
        retry_backoff_s=0.01,
        sleep=lambda s: None,
        background=True,
        **kwargs,  # type: ignore[arg-type]
    )


@pytest.fixture
def store(tmp_path: Path) -> GatedStore:
    return GatedStore(f"file://{tmp_path / 'store'}")


def model_tensors(publisher: StorePublisher) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in publisher.engine.model.state_dict().items()}


def published_tensors(store: FileStore, weights: WeightVersion, dest: Path) -> dict:
    model = AutoModelForCausalLM.from_pretrained(fetch_weights(store, weights, dest))
    return {k: v.detach() for k, v in model.state_dict().items()}


def test_the_snapshot_is_published_while_the_model_moves_on(store, tmp_path):
    announced: list[WeightVersion] = []
    publisher = background_publisher(store, announced)
    store.open.clear()
    at_step_1 = model_tensors(publisher)
    publisher.publish(1, after_version=0)
    assert store.holding.wait(WAIT_S)  # the upload is under way
    with torch.no_grad():  # the next optimizer step, meanwhile
        for parameter in publisher.engine.model.parameters():
            parameter.add_(1.0)
    assert publisher.progress().announced is None
    store.open.set()
    progress = publisher.drain()
    assert progress.announced == announced[0] and (announced[0].version, announced[0].step) == (
        1,
        1,
    )
    published = published_tensors(store, announced[0], tmp_path / "v1")
    assert all(torch.equal(published[k], at_step_1[k]) for k in at_step_1)
    publisher.close()


def test_a_newer_snapshot_replaces_a_waiting_one_and_versions_stay_dense(store):
    announced: list[WeightVersion] = []
    publisher = background_publisher(store, announced)
    store.open.clear()
    publisher.publish(0, after_version=0)
    assert store.holding.wait(WAIT_S)
    for step in (2, 4, 6):  # 2 waits, 4 and then 6 replace it
        publisher.publish(step, after_version=0)
    assert publisher.progress().skipped == 2
    store.open.set()
    progress = publisher.drain()
    assert [(w.version, w.step) for w in announced] == [(1, 0), (2, 6)]
    assert progress.skipped == 2 and progress.failed == 0 and progress.background_s > 0
    assert list_versions(store) == [1, 2] and read_latest(store) == announced[-1]
    publisher.close()


def test_files_go_before_the_manifest_and_the_manifest_before_latest(store):
    announced: list[WeightVersion] = []
    publisher = background_publisher(store, announced)
    for step in (0, 2):
        publisher.publish(step, after_version=0)
        publisher.drain()
    for version in (1, 2):
        prefix = f"versions/v{version:010d}/"
        own = [i for i, key in enumerate(store.writes) if key.startswith(prefix)]
        manifest = store.writes.index(prefix + MANIFEST)
        latest = [i for i, key in enumerate(store.writes) if key == LATEST][version - 1]
        assert max(i for i in own if i != manifest) < manifest < latest
    publisher.close()


def test_a_publish_that_fails_after_its_retries_is_counted_and_training_goes_on(
    store, tmp_path, caplog
):
    announced: list[WeightVersion] = []
    publisher = background_publisher(store, announced, retries=2)
    publisher.publish(0, after_version=0)
    publisher.drain()
    store.down_calls = 3  # the first attempt and both retries of the next publish
    with caplog.at_level(logging.ERROR, logger="tba.trainer.publish"):
        publisher.publish(2, after_version=1)
        progress = publisher.drain()
    assert progress.failed == 1 and progress.announced == announced[0]
    assert "publishing the weights of step 2 failed" in caplog.text
    assert "training goes on" in caplog.text
    publisher.publish(4, after_version=1)
    progress = publisher.drain()
    # The failed version's number goes to the next snapshot: versions stay dense.
    assert [(w.version, w.step) for w in announced] == [(1, 0), (2, 4)]
    assert progress.failed == 1 and read_latest(store) == announced[-1]
    fetch_weights(store, announced[-1], tmp_path / "v2")
    publisher.close()


def test_snapshots_are_cpu_copies_in_the_export_dtype_sharing_tied_weights():
    engine, _ = tiny_engine()
    weights = engine.model.state_dict()
    snapshot = take_snapshot(weights, 3, torch.bfloat16)
    assert snapshot.step == 3 and set(snapshot.state_dict) == set(weights)
    assert all(
        t.dtype == torch.bfloat16 and t.device.type == "cpu"
        for t in snapshot.state_dict.values()
        if t.is_floating_point()
    )
    tied = snapshot.state_dict["lm_head.weight"], snapshot.state_dict["transformer.wte.weight"]
    assert tied[0] is tied[1]
    fp32 = take_snapshot(weights, 3, torch.float32).state_dict["transformer.wte.weight"]
    assert fp32.data_ptr() != weights["transformer.wte.weight"].data_ptr()  # a copy


def test_a_bf16_export_is_half_the_bytes_and_loads_as_bf16(tmp_path):
    sizes = {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        store = FileStore(f"file://{tmp_path / name}")
        announced: list[WeightVersion] = []
        # Wide enough that the safetensors header is a small part of the file.
        publisher = background_publisher(store, announced, width=256, export_dtype=dtype)
        publisher.publish(0, after_version=0)
        publisher.drain()
        publisher.close()
        manifest = json.loads(store.get_bytes(f"versions/v{1:010d}/{MANIFEST}"))
        sizes[name] = manifest["files"]["model.safetensors"]["bytes"]
        local = fetch_weights(store, announced[0], tmp_path / f"{name}-fetched")
        assert json.loads((local / "config.json").read_text())["dtype"] == str(dtype)[6:]
        loaded = AutoModelForCausalLM.from_pretrained(local)
        assert next(loaded.parameters()).dtype == dtype
    assert sizes["bf16"] / sizes["fp32"] == pytest.approx(0.5, abs=0.005)
