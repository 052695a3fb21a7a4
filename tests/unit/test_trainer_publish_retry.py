"""StorePublisher over a real file:// store that becomes unreachable at a chosen operation:
retries with backoff, a version written whole whatever the attempt that failed, LATEST never
naming a version without its manifest, and a clear error once the retries are spent."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

import pytest

from tba.domain import WeightVersion
from tba.errors import FailedPreconditionError, UnavailableError
from tba.models.tiny import build_tiny_model, build_tiny_tokenizer
from tba.objectstore.local import FileStore
from tba.objectstore.weights import (
    LATEST,
    MANIFEST,
    fetch_weights,
    list_versions,
    read_latest,
    version_key,
)
from tba.trainer.config import OptimSettings
from tba.trainer.engine import LocalEngine
from tba.trainer.publish import MAX_RETRY_BACKOFF_S, PublishFailedError, StorePublisher

Trigger = Callable[[str, str], bool]


class OutageStore(FileStore):
    """A real file store that is unreachable for `down_calls` calls from the first call that
    `trigger(operation, key)` accepts. With `lose_reply`, that first call still lands and only
    its reply is lost (the write happened, the caller sees the outage)."""

    def __init__(self, uri: str) -> None:
        super().__init__(uri)
        self.trigger: Trigger = lambda op, key: False
        self.down_calls = 0
        self.lose_reply = False
        self.failed = 0

    def go_down(self, trigger: Trigger, down_calls: int, lose_reply: bool = False) -> None:
        self.trigger, self.down_calls, self.lose_reply = trigger, down_calls, lose_reply

    def _gate(self, op: str, key: str, call: Callable[[], object]) -> object:
        if self.down_calls > 0 and (self.failed > 0 or self.trigger(op, key)):
            self.down_calls -= 1
            first = self.failed == 0
            self.failed += 1
            if first and self.lose_reply:
                call()
            raise UnavailableError(f"store unreachable ({op} {key})")
        return call()

    def put_bytes(self, key: str, data: bytes) -> None:
        self._gate("put", key, lambda: super(OutageStore, self).put_bytes(key, data))

    def put_file(self, key: str, path: Path) -> None:
        self._gate("put", key, lambda: super(OutageStore, self).put_file(key, path))

    def get_bytes(self, key: str) -> bytes:
        data = self._gate("get", key, lambda: super(OutageStore, self).get_bytes(key))
        assert isinstance(data, bytes)
        return data

    def get_file(self, key: str, path: Path) -> None:
        self._gate("get", key, lambda: super(OutageStore, self).get_file(key, path))

    def list(self, prefix: str = "") -> list[str]:
        keys = self._gate("list", prefix, lambda: super(OutageStore, self).list(prefix))
        assert isinstance(keys, list)
        return keys

    def delete(self, key: str) -> None:
        self._gate("delete", key, lambda: super(OutageStore, self).delete(key))

    def exists(self, key: str) -> bool:
        return bool(self._gate("exists", key, lambda: super(OutageStore, self).exists(key)))


class Publisher:
    """A StorePublisher on a tiny model, with what it announced and the waits it took."""

    def __init__(self, store: OutageStore, retries: int, backoff_s: float = 0.5) -> None:
        tokenizer = build_tiny_tokenizer("0123456789+=")
        model = build_tiny_model(tokenizer, n_layer=1, n_embd=16, n_head=2, seed=1)
        self.announced: list[WeightVersion] = []
        self.waits_s: list[float] = []
        self.store = store
        self.publisher = StorePublisher(
            store,
            LocalEngine(model, OptimSettings(), total_steps=1),
            tokenizer,
            self.announced.append,
            keep_versions=2,
            retries=retries,
            retry_backoff_s=backoff_s,
            sleep=self.waits_s.append,
        )

    def publish(self, version: int, step: int) -> WeightVersion:
        """Publishes synchronously as `version` (the one after `version - 1`)."""
        self.publisher.publish(step, after_version=version - 1)
        announced = self.publisher.progress().announced
        assert announced is not None
        return announced


@pytest.fixture
def store(tmp_path: Path) -> OutageStore:
    return OutageStore(f"file://{tmp_path / 'store'}")


def assert_whole(store: FileStore, weights: WeightVersion, tmp_path: Path) -> None:
    """LATEST names `weights`, and the version fetches and verifies file by file."""
    assert read_latest(store) == weights
    fetch_weights(store, weights, tmp_path / f"fetched-{weights.version}")


def key_is(op: str, key: str) -> Trigger:
    return lambda o, k: o == op and k == key


@pytest.mark.parametrize(
    ("where", "trigger"),
    [
        ("reading LATEST", key_is("get", LATEST)),
        ("uploading the weights", key_is("put", f"{version_key(2)}/model.safetensors")),
        ("writing the manifest", key_is("put", f"{version_key(2)}/{MANIFEST}")),
        ("writing LATEST", key_is("put", LATEST)),
    ],
)
def test_an_outage_anywhere_in_a_publish_is_ridden_out(store, tmp_path, caplog, where, trigger):
    publisher = Publisher(store, retries=5)
    first = publisher.publish(1, step=0)
    store.go_down(trigger, down_calls=3)
    with caplog.at_level(logging.WARNING, logger="tba.trainer.publish"):
        second = publisher.publish(2, step=2)
    assert (second.version, second.step) == (2, 2), where
    assert publisher.announced == [first, second]
    assert publisher.waits_s == [0.5, 1.0, 2.0]
    retries = [r.getMessage() for r in caplog.records if "retry" in r.getMessage()]
    assert len(retries) == 3 and "publishing weight version 2 failed" in retries[0]
    assert_whole(store, second, tmp_path)
    assert list_versions(store) == [1, 2]


def test_a_lost_reply_to_latest_finishes_the_version_it_wrote(store, tmp_path):
    publisher = Publisher(store, retries=3)
    for version in (1, 2):
        publisher.publish(version, step=2 * version)
    # LATEST lands, its reply is lost, and the store is gone for the next two calls.
    store.go_down(key_is("put", LATEST), down_calls=3, lose_reply=True)
    third = publisher.publish(3, step=6)
    assert (third.version, third.step) == (3, 6)
    assert publisher.announced[-1] == third and len(publisher.announced) == 3
    assert_whole(store, third, tmp_path)
    assert list_versions(store) == [2, 3]  # retention, which the lost attempt never reached


def test_a_manifest_left_by_a_killed_trainer_is_written_again(store, tmp_path):
    publisher = Publisher(store, retries=0)
    publisher.publish(1, step=0)
    # A trainer killed between the manifest and LATEST left version 2 unfinished.
    store.put_bytes(f"{version_key(2)}/{MANIFEST}", json.dumps({"version": 2}).encode())
    second = publisher.publish(2, step=2)
    assert_whole(store, second, tmp_path)


def test_a_version_latest_already_names_is_still_refused(store):
    Publisher(store, retries=3).publish(1, step=0)
    # Another publisher, that knows of no version yet, takes version 1 again.
    with pytest.raises(FailedPreconditionError, match="already exists"):
        Publisher(store, retries=3).publish(1, step=2)


def test_an_outage_longer_than_the_retries_is_a_clear_error(store, tmp_path):
    publisher = Publisher(store, retries=6, backoff_s=4.0)
    first = publisher.publish(1, step=0)
    store.go_down(key_is("get", LATEST), down_calls=100)
    with pytest.raises(PublishFailedError, match=r"weight version 2 .* through 6 retries"):
        publisher.publish(2, step=2)
    assert publisher.waits_s == [4.0, 8.0] + [MAX_RETRY_BACKOFF_S] * 4
    assert publisher.announced == [first]
    store.down_calls = 0
    assert_whole(store, first, tmp_path)
