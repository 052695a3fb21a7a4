"""WeightSync over a real file:// store and a tiny transformers engine: newer versions load,
corrupt or deleted ones keep the old weights, and only the newest local folders stay."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tba.domain import WeightVersion
from tba.models.config import ModelSettings
from tba.models.loading import load_model
from tba.objectstore.local import FileStore
from tba.objectstore.weights import publish_weights, version_key
from tba.searcher.config import EngineSettings
from tba.searcher.engine import SamplingParams
from tba.searcher.hf_engine import TransformersEngine
from tba.searcher.weights import WeightSync

MODEL = ModelSettings(tiny_layers=1, tiny_width=32, tiny_heads=2, tiny_positions=64)


class Announcements:
    """What the buffer announces: each check reads the next entry (the last one repeats)."""

    def __init__(self, *versions: WeightVersion | None) -> None:
        self.versions = list(versions)
        self.reads = 0

    def __call__(self) -> WeightVersion | None:
        self.reads += 1
        return self.versions.pop(0) if len(self.versions) > 1 else self.versions[0]


@pytest.fixture
def store(tmp_path: Path) -> FileStore:
    return FileStore(f"file://{tmp_path / 'store'}")


@pytest.fixture
def engine() -> Iterator[TransformersEngine]:
    tokenizer, model = load_model(MODEL, 0)
    engine = TransformersEngine(model, tokenizer, EngineSettings(device="cpu"))
    yield engine
    engine.close()


def publish(store: FileStore, version: int, seed: int, keep_last: int = 5) -> WeightVersion:
    tokenizer, model = load_model(MODEL, seed)
    return publish_weights(store, version, 10 * version, model, tokenizer, keep_last=keep_last)


def sample(engine: TransformersEngine) -> list[Any]:
    prompts = [engine.tokenizer.encode("12+35=")]
    return engine.generate(prompts, SamplingParams(n=4, max_new_tokens=6, temperature=0.7, seed=1))


def sync_for(
    store: FileStore, engine: TransformersEngine, tmp_path: Path, latest: Any
) -> WeightSync:
    return WeightSync(latest, store, engine, tmp_path / "weights", keep_versions=2)


def test_nothing_announced_or_nothing_newer_loads_nothing(store, engine, tmp_path):
    assert sync_for(store, engine, tmp_path, Announcements(None)).check() is None
    assert engine.version == 0


def test_a_newer_announced_version_is_fetched_and_loaded(store, engine, tmp_path):
    before = sample(engine)
    sync = sync_for(store, engine, tmp_path, Announcements(publish(store, 1, seed=1)))
    reload_s = sync.check()
    assert reload_s is not None and reload_s >= 0 and sync.last_reload_s == reload_s
    assert engine.version == 1 and sync.latest_version == 1
    assert (tmp_path / "weights" / "v1" / "model.safetensors").is_file()
    assert sample(engine) != before
    assert sync.check() is None  # already loaded


def replace_bytes(path: Path, data: bytes) -> None:
    """Writes a new file over `path` (the store may hard-link what it hands out)."""
    staging = path.with_suffix(".staging")
    staging.write_bytes(data)
    os.replace(staging, path)


def test_a_corrupt_file_is_refused_and_retried_on_the_next_check(store, engine, tmp_path, caplog):
    announced = publish(store, 1, seed=1)
    stored = Path(store.root) / version_key(1) / "model.safetensors"
    good = stored.read_bytes()
    replace_bytes(stored, good[:-1] + bytes([good[-1] ^ 0xFF]))
    before = sample(engine)
    sync = sync_for(store, engine, tmp_path, Announcements(announced))
    assert sync.check() is None
    assert engine.version == 0 and sample(engine) == before
    assert "does not match its sha256" in caplog.text
    assert not (tmp_path / "weights" / "v1").exists()

    replace_bytes(stored, good)
    assert sync.check() is not None and engine.version == 1


def test_a_wrong_manifest_hash_is_refused(store, engine, tmp_path):
    announced = publish(store, 1, seed=1)
    forged = WeightVersion(1, announced.uri, "0" * 64, announced.step, announced.published_at_s)
    assert sync_for(store, engine, tmp_path, Announcements(forged)).check() is None
    assert engine.version == 0


def test_a_version_deleted_by_retention_is_followed_by_the_latest(store, engine, tmp_path):
    first = publish(store, 1, seed=1, keep_last=1)
    publish(store, 2, seed=2, keep_last=1)
    third = publish(store, 3, seed=3, keep_last=1)  # retention deleted 1 and 2
    announcements = Announcements(first, third)
    sync = sync_for(store, engine, tmp_path, announcements)
    assert sync.check() is not None
    assert engine.version == 3 and announcements.reads == 2


def test_only_the_newest_local_versions_are_kept(store, engine, tmp_path):
    versions = [publish(store, v, seed=v) for v in (1, 2, 3)]
    sync = sync_for(store, engine, tmp_path, Announcements(*versions))
    for expected in (1, 2, 3):
        assert sync.check() is not None and engine.version == expected
    assert sorted(p.name for p in (tmp_path / "weights").iterdir()) == ["v2", "v3"]
