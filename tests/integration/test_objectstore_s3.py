"""What the S3 store puts on the wire, against a real SeaweedFS server: weight files move
without per-request checksums or a body hash (their manifest's sha256 covers them), small
objects keep a CRC32 in a signed header."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tba.objectstore import open_object_store
from tba.objectstore.s3 import S3Store
from tests.fixtures.seaweedfs import SeaweedS3, store_settings

MIB = 1024 * 1024
UNSIGNED = b"UNSIGNED-PAYLOAD"


def _recording(store: Any) -> list[tuple[str, dict[str, bytes]]]:
    """Records (operation, checksum and content-hash headers) of every request `store` sends."""
    sent: list[tuple[str, dict[str, bytes]]] = []

    def record(request: Any, event_name: str, **_: Any) -> None:
        headers = {
            k.lower(): v
            for k, v in request.headers.items()
            if k.lower().startswith(("x-amz-checksum-", "x-amz-content-sha256", "content-md5"))
        }
        sent.append((event_name.rsplit(".", 1)[-1], headers))

    assert isinstance(store, S3Store)
    store._client.meta.events.register("before-send.s3", record)
    return sent


def _transfer(store: Any, tmp_path: Path) -> None:
    source = tmp_path / "model.bin"
    source.write_bytes(bytes(range(256)) * (11 * MIB // 256))  # three 5 MiB parts
    store.put_bytes("LATEST", b'{"version": 1}')
    store.put_file("v/model.bin", source)
    assert store.get_bytes("LATEST") == b'{"version": 1}'
    store.get_file("v/model.bin", tmp_path / "back.bin")
    assert (tmp_path / "back.bin").read_bytes() == source.read_bytes()


def test_weight_files_move_without_checksums_or_body_hash(
    seaweedfs: SeaweedS3, tmp_path: Path
) -> None:
    store = open_object_store(store_settings(seaweedfs, multipart_chunk_bytes=5 * MIB))
    sent = _recording(store)
    _transfer(store, tmp_path)
    parts = [headers for op, headers in sent if op == "UploadPart"]
    assert len(parts) == 3
    assert all(headers == {"x-amz-content-sha256": UNSIGNED} for headers in parts)
    small_put = next(headers for op, headers in sent if op == "PutObject")
    assert "x-amz-checksum-crc32" in small_put
    assert small_put["x-amz-content-sha256"] == UNSIGNED
    # Two ranged GETs of the 11 MiB file and one GET of LATEST; no HEAD before the download.
    assert [op for op, _ in sent if op in ("GetObject", "HeadObject")] == ["GetObject"] * 4


def test_sign_payload_hashes_every_body(seaweedfs: SeaweedS3, tmp_path: Path) -> None:
    store = open_object_store(
        store_settings(seaweedfs, multipart_chunk_bytes=5 * MIB, sign_payload=True)
    )
    sent = _recording(store)
    _transfer(store, tmp_path)
    uploads = [headers for op, headers in sent if op in ("UploadPart", "PutObject")]
    assert len(uploads) == 4
    assert all(len(headers["x-amz-content-sha256"]) == 64 for headers in uploads)
