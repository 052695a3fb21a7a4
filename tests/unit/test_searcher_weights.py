"""WeightSync over a real file:// store and a tiny transformers engine: a newer version is
downloaded and prepared in the background while the engine generates with the old weights,
and swapped in only by a later check; the newest announced version wins; corrupt, deleted or
unfitting versions keep the old weights; only the newest local folders stay; closing waits
for the download in flight."""

from __future__ import annotations

import logging
import os
import threading
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
WAIT_S = 60.0


class Announcements:
    """What the buffer announces: each check reads the next entry (the last one repeats)."""

    def __init__(self, *versions: WeightVersion | None) -> None:
        self.versions = list(versions)
        self.asked: list[tuple[int, float]] = []  # (newer_than, wait_s) of each read

    def __call__(self, newer_than: int = 0, wait_s: float = 0.0) -> WeightVersion | None:
        self.asked.append((newer_than, wait_s))
        return self.versions.pop(0) if len(self.versions) > 1 else self.versions[0]


class HeldStore(FileStore):
    """A file:// store whose downloads of weights files wait until `released` is set, and
    which records the versions downloaded."""

    def __init__(self, uri: str) -> None:
        super().__init__(uri)
        self.released = threading.Event()
        self.downloading = threading.Event()
        self.downloads: set[int] = set()

    def get_file(self, key: str, path: Path) -> None:
        self.downloads.add(int(key.split("/")[1].removeprefix("v")))
        self.downloading.set()
        assert self.released.wait(WAIT_S)
        super().get_file(key, path)


@pytest.fixture
def store(tmp_path: Path) -> FileStore:
    return FileStore(f"file://{tmp_path / 'store'}")


@pytest.fixture
def held(tmp_path: Path) -> HeldStore:
    return HeldStore(f"file://{tmp_path / 'store'}")


@pytest.fixture
def engine() -> Iterator[TransformersEngine]:
    tokenizer, model = load_model(MODEL, 0)
    engine = TransformersEngine(model, tokenizer, EngineSettings(device="cpu"))
    yield engine
    engine.close()


def publish(
    store: FileStore, version: int, seed: int, keep_last: int = 5, model: ModelSettings = MODEL
) -> WeightVersion:
    tokenizer, weights = load_model(model, seed)
    return publish_weights(store, version, 10 * version, weights, tokenizer, keep_last=keep_last)


def sample(engine: TransformersEngine) -> list[Any]:
    prompts = [engine.tokenizer.encode("12+35=")]
    return engine.generate(prompts, SamplingParams(n=4, max_new_tokens=6, temperature=0.7, seed=1))


@pytest.fixture
def sync_for(engine: TransformersEngine, tmp_path: Path) -> Iterator[Any]:
    made: list[WeightSync] = []

    def make(store: FileStore, latest: Any, keep_versions: int = 2) -> WeightSync:
        made.append(WeightSync(latest, store, engine, tmp_path / "weights", keep_versions))
        return made[-1]

    yield make
    for sync in made:
        sync.close()


def settled(sync: WeightSync) -> Any:
    """The next check once the fetch in flight is done."""
    assert sync.wait_fetch(WAIT_S)
    return sync.check()


def test_nothing_announced_or_nothing_newer_fetches_nothing(store, engine, sync_for):
    sync = sync_for(store, Announcements(None))
    assert sync.check() is None and not sync.wait_fetch(0)
    assert engine.version == 0


def test_a_newer_version_is_fetched_in_the_background_and_swapped_in_by_a_check(
    store, engine, sync_for, tmp_path
):
    before = sample(engine)
    sync = sync_for(store, Announcements(publish(store, 1, seed=1)))
    assert sync.check() is None  # the fetch has started, nothing is swapped yet
    assert sync.wait_fetch(WAIT_S)
    # Ready, but the weights in use change only at a check, between rounds.
    assert engine.version == 0 and sample(engine) == before
    swap = sync.check()
    assert swap is not None and (swap.version, swap.step) == (1, 10)
    assert 0 <= swap.swap_s <= swap.reload_s and 0 < swap.fetch_s <= swap.reload_s
    assert engine.version == 1 and sync.latest_version == 1
    assert (tmp_path / "weights" / "v1" / "model.safetensors").is_file()
    assert sample(engine) != before
    assert sync.check() is None and not sync.wait_fetch(0)  # already loaded


def test_waiting_for_an_announcement_asks_for_a_version_newer_than_any_seen_and_fetches_it(
    store, engine, sync_for
):
    first, second = publish(store, 1, seed=1), publish(store, 2, seed=2)
    announced = Announcements(first, first, first, second)
    sync = sync_for(store, announced)
    sync.check()
    assert settled(sync).version == 1 and announced.asked == [(0, 0.0), (0, 0.0)]
    assert not sync.wait_announce(5.0)  # version 1 again: nothing newer, nothing fetched
    assert announced.asked[-1] == (1, 5.0) and not sync.wait_fetch(0)
    assert sync.wait_announce(5.0) and announced.asked[-1] == (1, 5.0)
    assert settled(sync).version == 2 and engine.version == 2


def test_waiting_for_an_announcement_with_a_fetch_in_flight_asks_nothing(held, sync_for):
    announced = Announcements(publish(held, 1, seed=1))
    sync = sync_for(held, announced)
    sync.check()
    assert held.downloading.wait(WAIT_S)
    reads = len(announced.asked)
    assert not sync.wait_announce(5.0) and len(announced.asked) == reads
    held.released.set()
    assert settled(sync).version == 1


def test_the_engine_generates_while_a_download_is_held(held, engine, sync_for):
    before = sample(engine)
    sync = sync_for(held, Announcements(publish(held, 1, seed=1)))
    assert sync.check() is None
    assert held.downloading.wait(WAIT_S)
    # The download is stuck; generation and checks go on with the old weights.
    assert sample(engine) == before
    assert sync.check() is None and engine.version == 0
    held.released.set()
    assert settled(sync) is not None and engine.version == 1


def test_the_newest_version_announced_during_a_download_is_fetched_next(held, engine, sync_for):
    versions = [publish(held, v, seed=v) for v in (1, 2, 3)]
    announced = [versions[0]]
    sync = sync_for(held, lambda: announced[-1])
    assert sync.check() is None and held.downloading.wait(WAIT_S)
    announced += versions[1:]  # 2, then 3, while version 1 downloads
    assert sync.check() is None and sync.latest_version == 3
    held.released.set()
    first = settled(sync)  # swaps version 1 in and starts fetching 3, skipping 2
    assert first is not None and first.version == 1 and engine.version == 1
    assert settled(sync).version == 3 and engine.version == 3
    assert held.downloads == {1, 3}


def replace_bytes(path: Path, data: bytes) -> None:
    """Writes a new file over `path` (the store may hard-link what it hands out)."""
    staging = path.with_suffix(".staging")
    staging.write_bytes(data)
    os.replace(staging, path)


def test_a_corrupt_file_is_refused_and_retried_on_the_next_check(
    store, engine, sync_for, tmp_path, caplog
):
    announced = publish(store, 1, seed=1)
    stored = Path(store.root) / version_key(1) / "model.safetensors"
    good = stored.read_bytes()
    replace_bytes(stored, good[:-1] + bytes([good[-1] ^ 0xFF]))
    before = sample(engine)
    sync = sync_for(store, Announcements(announced))
    sync.check()
    assert settled(sync) is None  # refused; not fetched again by the same check
    assert not sync.wait_fetch(0)
    assert engine.version == 0 and sample(engine) == before
    assert "does not match its sha256" in caplog.text
    assert not (tmp_path / "weights" / "v1").exists()

    replace_bytes(stored, good)
    assert sync.check() is None  # the retry starts
    assert settled(sync) is not None and engine.version == 1


def test_a_wrong_manifest_hash_is_refused(store, engine, sync_for):
    announced = publish(store, 1, seed=1)
    forged = WeightVersion(1, announced.uri, "0" * 64, announced.step, announced.published_at_s)
    sync = sync_for(store, Announcements(forged))
    sync.catch_up()
    assert engine.version == 0


def test_weights_of_another_architecture_are_refused_in_the_background(
    store, engine, sync_for, tmp_path, caplog
):
    wider = MODEL.model_copy(update={"tiny_width": 64})
    sync = sync_for(store, Announcements(publish(store, 1, seed=1, model=wider)))
    before = sample(engine)
    sync.catch_up()
    assert engine.version == 0 and sample(engine) == before
    assert "do not fit the model" in caplog.text


def test_a_version_deleted_by_retention_is_followed_by_the_latest(store, engine, sync_for, caplog):
    first = publish(store, 1, seed=1, keep_last=1)
    publish(store, 2, seed=2, keep_last=1)
    third = publish(store, 3, seed=3, keep_last=1)  # retention deleted 1 and 2
    announcements = Announcements(first, third)
    sync = sync_for(store, announcements)
    assert sync.check() is None
    with caplog.at_level(logging.WARNING, logger="tba.searcher.weights"):
        assert settled(sync) is None  # version 1 is gone: version 3 is being fetched
    assert "weight version 1 is gone" in caplog.text
    assert settled(sync).version == 3 and engine.version == 3


def test_only_the_newest_local_versions_are_kept(store, engine, sync_for, tmp_path):
    versions = [publish(store, v, seed=v) for v in (1, 2, 3)]
    sync = sync_for(store, Announcements(*versions))
    for expected in (1, 2, 3):
        sync.catch_up()
        assert engine.version == expected
    assert sorted(p.name for p in (tmp_path / "weights").iterdir()) == ["v2", "v3"]


def test_closing_waits_for_the_download_in_flight_and_swaps_nothing(held, engine, sync_for):
    # Only this sync's fetcher counts: another test's, left to the garbage collector, may
    # still be ending (seen once on a slow machine).
    earlier = set(threading.enumerate())
    sync = sync_for(held, Announcements(publish(held, 1, seed=1)))
    sync.check()
    assert held.downloading.wait(WAIT_S)
    closing = threading.Thread(target=sync.close)
    closing.start()
    closing.join(0.2)
    assert closing.is_alive()  # the download is held
    held.released.set()
    closing.join(WAIT_S)
    assert not closing.is_alive()
    fetchers = [t for t in threading.enumerate() if t.name.startswith("searcher-weights")]
    assert not set(fetchers) - earlier
    assert engine.version == 0
