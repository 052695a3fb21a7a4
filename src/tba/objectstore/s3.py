"""`s3://` object store (AWS S3, MinIO, SeaweedFS) through boto3: the only module that
imports boto3. Large files move as parallel multipart transfers."""

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
        )
        if settings.create_bucket:
            self._ensure_bucket()

    @property
    def uri(self) -> str:
        return self._uri

    def put_bytes(self, key: str, data: bytes) -> None:
        self._call(key, self._client.put_object, Bucket=self.bucket, Key=self._key(key), Body=data)

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
        response = self._call(key, self._client.get_object, Bucket=self.bucket, Key=self._key(key))
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
            s3={"addressing_style": settings.addressing_style},
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
        return exc
    if isinstance(exc, EndpointConnectionError | BotoCoreError):
        return UnavailableError(f"object store unreachable: {exc}")
    return exc
