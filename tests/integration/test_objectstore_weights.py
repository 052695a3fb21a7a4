"""Publishing and fetching weight versions through both stores (file:// and SeaweedFS)."""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tba.errors import FailedPreconditionError, NotFoundError
from tba.models.tiny import build_tiny_model, build_tiny_tokenizer
from tba.objectstore import ObjectStore, ObjectStoreSettings, open_object_store
from tba.objectstore import weights as weights_module
from tba.objectstore.local import FileStore
from tba.objectstore.weights import (
    HASH_BESIDE_MIN_BYTES,
    LATEST,
    MANIFEST,
    WeightsIntegrityError,
    apply_retention,
    fetch_weights,
    list_versions,
    publish_weights,
    read_latest,
    version_key,
)


@pytest.fixture(params=["file", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    if request.param == "file":
        return open_object_store(ObjectStoreSettings(uri=f"file://{tmp_path / 'store'}"))
    return open_object_store(request.getfixturevalue("s3_store_settings"))


@pytest.fixture(scope="module")
def tiny() -> tuple[Any, Any]:
    tokenizer = build_tiny_tokenizer()
    return build_tiny_model(tokenizer, n_layer=1, n_embd=32, n_head=2, seed=3), tokenizer


def test_published_version_loads_with_from_pretrained(store, tiny, tmp_path):
    model, tokenizer = tiny
    weights = publish_weights(store, 1, step=10, model=model, tokenizer=tokenizer)
    assert weights.uri == f"{store.uri}/{version_key(1)}" and weights.step == 10
    manifest = store.get_bytes(f"{version_key(1)}/{MANIFEST}")
    assert hashlib.sha256(manifest).hexdigest() == weights.sha256
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(
        json.loads(manifest)["files"]
    )
    assert read_latest(store) == weights

    local = fetch_weights(store, weights, tmp_path / "fetched")
    loaded = AutoModelForCausalLM.from_pretrained(local)
    ids = torch.tensor([tokenizer("12+34=").input_ids])
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)
    assert AutoTokenizer.from_pretrained(local)("7").input_ids == tokenizer("7").input_ids


def test_retention_keeps_newest_and_never_what_latest_names(store, tiny):
    model, tokenizer = tiny
    for version in (1, 2, 3):
        publish_weights(store, version, step=version, model=model, tokenizer=tokenizer, keep_last=2)
    assert list_versions(store) == [2, 3]
    assert store.list(f"{version_key(1)}/") == []
    # A publish that died after its manifest but before LATEST: LATEST still names 3.
    store.put_bytes(f"{version_key(4)}/{MANIFEST}", b"{}")
    assert apply_retention(store, keep_last=1) == [2]
    assert list_versions(store) == [3, 4]


def test_a_version_is_never_published_twice(store, tiny):
    model, tokenizer = tiny
    publish_weights(store, 5, step=1, model=model, tokenizer=tokenizer)
    with pytest.raises(FailedPreconditionError, match="already exists"):
        publish_weights(store, 5, step=2, model=model, tokenizer=tokenizer)


def test_fetch_rejects_a_tampered_file(store, tiny, tmp_path):
    model, tokenizer = tiny
    weights = publish_weights(store, 1, step=1, model=model, tokenizer=tokenizer)
    store.put_bytes(f"{version_key(1)}/config.json", b'{"tampered": true}')
    with pytest.raises(WeightsIntegrityError, match=r"config\.json"):
        fetch_weights(store, weights, tmp_path / "fetched")
    assert not (tmp_path / "fetched" / "config.json").exists()


@pytest.fixture(params=["here", "beside"])
def hashed(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every file hashed by the thread that moves it (a tiny model's), or on the hashing
    thread beside the transfers (a big model's)."""
    if request.param == "beside":
        monkeypatch.setattr(weights_module, "HASH_BESIDE_MIN_BYTES", 0)
    return str(request.param)


def test_fetch_names_and_removes_every_tampered_file_and_keeps_the_good_ones(
    store, tiny, tmp_path, hashed
):
    model, tokenizer = tiny
    weights = publish_weights(store, 1, step=1, model=model, tokenizer=tokenizer)
    store.put_bytes(f"{version_key(1)}/config.json", b'{"tampered": true}')
    store.put_bytes(f"{version_key(1)}/tokenizer.json", b"{}")
    with pytest.raises(WeightsIntegrityError, match=r"config\.json, tokenizer\.json"):
        fetch_weights(store, weights, tmp_path / "fetched")
    assert not (tmp_path / "fetched" / "config.json").exists()
    assert not (tmp_path / "fetched" / "tokenizer.json").exists()
    assert (tmp_path / "fetched" / "model.safetensors").is_file()


def test_fetch_rejects_a_manifest_that_does_not_match_the_announcement(store, tiny, tmp_path):
    model, tokenizer = tiny
    weights = publish_weights(store, 1, step=1, model=model, tokenizer=tokenizer)
    forged = type(weights)(1, weights.uri, "0" * 64, 1, weights.published_at_s)
    with pytest.raises(WeightsIntegrityError, match="manifest"):
        fetch_weights(store, forged, tmp_path / "fetched")


def test_fetch_of_a_deleted_version_is_not_found(store, tiny, tmp_path):
    model, tokenizer = tiny
    first = publish_weights(store, 1, step=1, model=model, tokenizer=tokenizer, keep_last=1)
    publish_weights(store, 2, step=2, model=model, tokenizer=tokenizer, keep_last=1)
    with pytest.raises(NotFoundError):
        fetch_weights(store, first, tmp_path / "fetched")


class _RecordingStore(FileStore):
    """A real file store that remembers the order of writes."""

    def __init__(self, uri: str) -> None:
        super().__init__(uri)
        self.writes: list[str] = []

    def put_bytes(self, key: str, data: bytes) -> None:
        self.writes.append(key)
        super().put_bytes(key, data)

    def put_file(self, key: str, path: Path) -> None:
        self.writes.append(key)
        super().put_file(key, path)


def test_files_then_manifest_then_latest(tiny, tmp_path):
    model, tokenizer = tiny
    store = _RecordingStore(f"file://{tmp_path}")
    publish_weights(store, 1, step=1, model=model, tokenizer=tokenizer)
    assert store.writes[-2:] == [f"{version_key(1)}/{MANIFEST}", LATEST]
    assert len(store.writes) >= 5


class _ThreadsSeenStore(FileStore):
    """A real file store that notes whether the hashing thread ran during its transfers."""

    def __init__(self, uri: str) -> None:
        super().__init__(uri)
        self.hashing_thread_seen = False

    def _note_threads(self) -> None:
        names = (thread.name for thread in threading.enumerate())
        self.hashing_thread_seen |= any(name.startswith("tba-sha256") for name in names)

    def put_file(self, key: str, path: Path) -> None:
        self._note_threads()
        super().put_file(key, path)

    def get_file(self, key: str, path: Path) -> None:
        self._note_threads()
        super().get_file(key, path)


def test_only_big_files_are_hashed_on_a_thread_of_their_own(tiny, tmp_path, hashed):
    model, tokenizer = tiny
    assert HASH_BESIDE_MIN_BYTES > 1024 * 1024  # the tiny model's files are all below it
    store = _ThreadsSeenStore(f"file://{tmp_path / 'store'}")
    weights = publish_weights(store, 1, step=1, model=model, tokenizer=tokenizer)
    fetch_weights(store, weights, tmp_path / "fetched")
    assert store.hashing_thread_seen == (hashed == "beside")
