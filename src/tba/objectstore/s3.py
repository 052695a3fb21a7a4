"""`s3://` object store (AWS S3, MinIO, SeaweedFS) through boto3: the only module that
imports boto3. Large files move as parallel multipart transfers.

Integrity without per-byte work the caller already does: weight files are verified end to end
by the sha256 their manifest lists (`weights.fetch_weights`), so their transfers carry no CRC32
(botocore's default since 1.36: one on every upload part, a check on every download) and,
unless `sign_payload`, no SigV4 body hash (botocore's default on http:// endpoints, where the
CRC32 also goes in a header, so both are extra passes over each part before it is sent).
Small objects (the manifest, `LATEST`) still carry a CRC32, in a header that SigV4 signs, and
are checked on read where the server returns it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import boto3
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, EndpointConnectionError

from tba.errors import NotFoundError, UnavailableError
from tba.objectstore.base import check_key
from tba.objectstore.config import ObjectStoreSettings

_MISSING = {"NoSuchKey", "404", "NotFound"}
_MISSING_BUCKET = {"NoSuchBucket"}
# The server is up but cannot serve now (a restarting SeaweedFS answers 500 InternalError for
# seconds): like an unreachable store, worth retrying by the caller once boto3's retries end.
_SERVER_BUSY = {"InternalError", "ServiceUnavailable", "SlowDown", "RequestTimeout"}
_IO_CHUNK_BYTES = 1024 * 1024


class S3Store:
    def __init__(self, settings: ObjectStoreSettings) -> None:
        self._uri = settings.uri.rstrip("/")
        self.bucket, _, prefix = self._uri.removeprefix("s3://").partition("/")
        self.prefix = f"{prefix}/" if prefix else ""
        self._client = _client(settings)
        self._transfer = TransferConfig(
            multipart_threshold=settings.multipart_chunk_bytes,
            multipart_chunksize=settings.multipart_chunk_bytes,
            max_concurrency=settings.max_concurrency,
            # Reads of a download body: s3transfer's 256 KiB cost a quarter more client CPU
            # than 1 MiB on a 400 MB file; its queue holds at most 100 of them.
            io_chunksize=_IO_CHUNK_BYTES,
        )
        if settings.create_bucket:
            self._ensure_bucket()

    @property
    def uri(self) -> str:
        return self._uri

    def put_bytes(self, key: str, data: bytes) -> None:
        self._call(
            key,
            self._client.put_object,
            Bucket=self.bucket,
            Key=self._key(key),
            Body=data,
            ChecksumAlgorithm="CRC32",
        )

    def put_file(self, key: str, path: Path) -> None:
        self._call(
            key,
            self._client.upload_file,
            Filename=str(path),
            Bucket=self.bucket,
            Key=self._key(key),
            Config=self._transfer,
        )

    def get_bytes(self, key: str) -> bytes:
        response = self._call(
            key,
            self._client.get_object,
            Bucket=self.bucket,
            Key=self._key(key),
            ChecksumMode="ENABLED",
        )
        body: bytes = response["Body"].read()
        return body

    def get_file(self, key: str, path: Path) -> None:
        self._call(
            key,
            self._client.download_file,
            Bucket=self.bucket,
            Key=self._key(key),
            Filename=str(path),
            Config=self._transfer,
        )

    def list(self, prefix: str = "") -> list[str]:
        paginator = self._client.get_paginator("list_objects_v2")
        pages = paginator.paginate(Bucket=self.bucket, Prefix=self.prefix + prefix)
        keys: list[str] = []
        try:
            for page in pages:
                keys.extend(obj["Key"][len(self.prefix) :] for obj in page.get("Contents", []))
        except (ClientError, BotoCoreError) as exc:
            raise _translate(exc, prefix) from exc
        return sorted(keys)

    def delete(self, key: str) -> None:
        self._call(key, self._client.delete_object, Bucket=self.bucket, Key=self._key(key))

    def exists(self, key: str) -> bool:
        try:
            self._call(key, self._client.head_object, Bucket=self.bucket, Key=self._key(key))
        except NotFoundError:
            return False
        return True

    def _key(self, key: str) -> str:
        return self.prefix + check_key(key)

    def _ensure_bucket(self) -> None:
        try:
            self._client.head_bucket(Bucket=self.bucket)
        except ClientError:
            self._call(self.bucket, self._client.create_bucket, Bucket=self.bucket)

    def _call(self, key: str, method: Any, **kwargs: Any) -> Any:
        try:
            return method(**kwargs)
        except (ClientError, BotoCoreError) as exc:
            raise _translate(exc, key) from exc


def _client(settings: ObjectStoreSettings) -> Any:
    def secret(value: Any) -> str | None:
        return value.get_secret_value() if value is not None else None

    return boto3.client(
        "s3",
        endpoint_url=settings.endpoint_url,
        region_name=settings.region,
        aws_access_key_id=secret(settings.access_key_id),
        aws_secret_access_key=secret(settings.secret_access_key),
        config=Config(
            s3={
                "addressing_style": settings.addressing_style,
                "payload_signing_enabled": settings.sign_payload,
            },
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
            # A connection per transfer thread, plus one for the small requests beside them:
            # botocore's default pool of 10 would make threads beyond 9 wait.
            max_pool_connections=max(10, settings.max_concurrency + 1),
            retries={"max_attempts": settings.retries + 1, "mode": "standard"},
            connect_timeout=settings.timeout_s,
            read_timeout=settings.timeout_s,
        ),
    )


def _translate(exc: Exception, key: str) -> Exception:
    if isinstance(exc, ClientError):
        code = str(exc.response.get("Error", {}).get("Code", ""))
        if code in _MISSING:
            return NotFoundError(f"no object {key}")
        if code in _MISSING_BUCKET:
            return NotFoundError(f"no bucket for {key}: {exc}")
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
        if code in _SERVER_BUSY or status >= 500:
            return UnavailableError(f"object store failing for {key}: {exc}")
        return exc
    if isinstance(exc, EndpointConnectionError | BotoCoreError):
        return UnavailableError(f"object store unreachable: {exc}")
    return exc
