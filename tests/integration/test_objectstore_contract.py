"""One contract suite for every object store: the same tests against `file://` and against a
real SeaweedFS S3 server."""

from __future__ import annotations

from pathlib import Path

import pytest

from tba.errors import InvalidArgumentError, NotFoundError
from tba.objectstore import ObjectStore, ObjectStoreSettings, open_object_store


@pytest.fixture(params=["file", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    if request.param == "file":
        return open_object_store(ObjectStoreSettings(uri=f"file://{tmp_path / 'store'}"))
    return open_object_store(request.getfixturevalue("s3_store_settings"))


def test_bytes_round_trip_and_overwrite(store: ObjectStore) -> None:
    store.put_bytes("a/b.json", b"first")
    store.put_bytes("a/b.json", b"second")
    assert store.get_bytes("a/b.json") == b"second"
    assert store.exists("a/b.json")
    assert not store.exists("a/c.json")


def test_file_round_trip(store: ObjectStore, tmp_path: Path) -> None:
    source = tmp_path / "source.bin"
    payload = bytes(range(256)) * 40_000  # ~10 MB: more than one read chunk
    source.write_bytes(payload)
    store.put_file("v/model.bin", source)
    target = tmp_path / "out" / "model.bin"
    target.parent.mkdir()
    target.write_bytes(b"stale")
    store.get_file("v/model.bin", target)
    assert target.read_bytes() == payload


def test_list_is_sorted_and_prefix_scoped(store: ObjectStore) -> None:
    for key in ["versions/v2/x", "versions/v1/y", "versions/v1/a", "LATEST", "versionsX/z"]:
        store.put_bytes(key, b".")
    assert store.list("versions/") == ["versions/v1/a", "versions/v1/y", "versions/v2/x"]
    assert store.list("versions/v1/") == ["versions/v1/a", "versions/v1/y"]
    assert store.list("versions/v1") == ["versions/v1/a", "versions/v1/y"]
    assert store.list("vers") == ["versions/v1/a", "versions/v1/y", "versions/v2/x", "versionsX/z"]
    assert store.list("versions/v3/") == store.list("a/../versions/") == []
    assert len(store.list()) == 5


def test_a_file_put_again_replaces_the_first(store: ObjectStore, tmp_path: Path) -> None:
    for name, payload in [("first.bin", b"first"), ("second.bin", b"second")]:
        (tmp_path / name).write_bytes(payload)
        store.put_file("v/model.bin", tmp_path / name)
    assert store.get_bytes("v/model.bin") == b"second"
    assert store.list("v/") == ["v/model.bin"]
    assert (tmp_path / "first.bin").read_bytes() == b"first"


def test_delete_is_idempotent(store: ObjectStore) -> None:
    store.put_bytes("k/one", b"1")
    store.delete("k/one")
    store.delete("k/one")
    assert store.list("k/") == []
    assert not store.exists("k/one")


def test_missing_keys_raise_not_found(store: ObjectStore, tmp_path: Path) -> None:
    with pytest.raises(NotFoundError):
        store.get_bytes("nope")
    with pytest.raises(NotFoundError):
        store.get_file("nope", tmp_path / "nope")


@pytest.mark.parametrize("key", ["", "/abs", "a/../b", "a//b", "./a"])
def test_bad_keys_are_rejected(store: ObjectStore, key: str) -> None:
    with pytest.raises(InvalidArgumentError):
        store.put_bytes(key, b"x")
