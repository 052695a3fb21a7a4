"""Settings of the object store that holds published weights (`[objectstore]`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr, field_validator

from tba.settings import Section

MIB = 1024 * 1024


class ObjectStoreSettings(Section):
    """`[objectstore]`: where weights are published; `file://` (default) or `s3://`."""

    uri: str = Field(
        "file://runs/weights",
        min_length=8,
        max_length=2048,
        description="Root of the store: `file://PATH` (absolute with a third slash, e.g. "
        "file:///data/weights, else relative to the working directory) or "
        "`s3://BUCKET/PREFIX`.",
    )
    endpoint_url: str | None = Field(
        None,
        max_length=2048,
        description="S3 endpoint (MinIO, SeaweedFS); unset uses AWS's endpoint for the region.",
    )
    region: str = Field("us-east-1", min_length=1, max_length=64, description="S3 region.")
    access_key_id: SecretStr | None = Field(
        None, description="S3 access key id; unset uses boto3's default credential chain."
    )
    secret_access_key: SecretStr | None = Field(
        None, description="S3 secret access key; unset uses boto3's default credential chain."
    )
    addressing_style: Literal["path", "virtual", "auto"] = Field(
        "path",
        description="S3 bucket addressing; `path` is what MinIO and SeaweedFS serve by default.",
    )
    create_bucket: bool = Field(
        False, description="Create the S3 bucket if it is missing (local and test servers)."
    )
    multipart_chunk_bytes: int = Field(
        64 * MIB,
        ge=5 * MIB,
        le=5 * 1024 * MIB,
        description="Part size of S3 multipart uploads and ranged downloads.",
    )
    max_concurrency: int = Field(8, ge=1, le=64, description="Parallel S3 part transfers per file.")
    sign_payload: bool = Field(
        False,
        description="SigV4-sign the body of S3 uploads: one more SHA-256 pass over every byte "
        "on the client, on plain http:// endpoints too. Off, uploads are sent as UNSIGNED-PAYLOAD "
        "and weight files are still verified end to end by the manifest's sha256; small objects "
        "(manifest, LATEST) carry a CRC32 in a signed header. Turn on for a server that refuses "
        "unsigned payloads.",
    )
    retries: int = Field(
        5, ge=0, le=100, description="Retries of a failed S3 request (boto3 standard mode)."
    )
    timeout_s: float = Field(
        60.0, gt=0, le=3600, description="Connect and read timeout of one S3 request."
    )

    @field_validator("uri")
    @classmethod
    def _check_uri(cls, value: str) -> str:
        if value.startswith("file://"):
            if not value.removeprefix("file://"):
                raise ValueError("file:// URI needs a path")
            return value
        if value.startswith("s3://"):
            if not value.removeprefix("s3://").split("/", 1)[0]:
                raise ValueError("s3:// URI needs a bucket")
            return value
        raise ValueError("uri must start with file:// or s3://")
