from pathlib import Path

import pytest
from pydantic import ValidationError

from tba.errors import InvalidArgumentError
from tba.objectstore import ObjectStoreSettings, open_object_store
from tba.objectstore.base import join_uri, key_of
from tba.objectstore.local import FileStore


def test_uri_and_key_round_trip():
    uri = join_uri("s3://bucket/run1/", "versions/v0000000003")
    assert uri == "s3://bucket/run1/versions/v0000000003"
    assert key_of("s3://bucket/run1", uri) == "versions/v0000000003"


def test_key_of_a_uri_outside_the_root_is_an_error():
    with pytest.raises(InvalidArgumentError):
        key_of("s3://bucket/run1", "s3://bucket/run2/versions/v1")
    with pytest.raises(InvalidArgumentError):
        key_of("file:///data/w", "file:///data/w/../x")


@pytest.mark.parametrize("uri", ["http://x/y", "s3:///prefix", "file://", "weights"])
def test_bad_store_uris_are_rejected(uri):
    with pytest.raises(ValidationError, match="uri"):
        ObjectStoreSettings(uri=uri)


def test_file_uris_absolute_and_relative(tmp_path, monkeypatch):
    absolute = open_object_store(ObjectStoreSettings(uri=f"file://{tmp_path}/abs"))
    assert isinstance(absolute, FileStore) and absolute.root == tmp_path / "abs"
    monkeypatch.chdir(tmp_path)
    relative = open_object_store(ObjectStoreSettings(uri="file://rel/w"))
    assert isinstance(relative, FileStore) and relative.root == Path("rel/w")
    relative.put_bytes("k", b"v")
    assert (tmp_path / "rel" / "w" / "k").read_bytes() == b"v"


def test_file_store_leaves_no_temporary_files_and_prunes_empty_folders(tmp_path):
    store = FileStore(f"file://{tmp_path}")
    store.put_bytes("versions/v1/a", b"1")
    assert sorted(p.name for p in (tmp_path / "versions" / "v1").iterdir()) == ["a"]
    assert (tmp_path / "versions" / "v1" / "a").stat().st_mode & 0o777 == 0o644
    store.delete("versions/v1/a")
    assert not (tmp_path / "versions").exists()
    assert tmp_path.exists()
