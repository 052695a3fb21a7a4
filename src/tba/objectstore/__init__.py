"""Object stores for published weights: `file://` (embedded default) and `s3://`."""

from __future__ import annotations

from tba.objectstore.base import ObjectStore
from tba.objectstore.config import ObjectStoreSettings


def open_object_store(settings: ObjectStoreSettings) -> ObjectStore:
    """The store that `settings.uri` names; boto3 is imported only for `s3://`."""
    if settings.uri.startswith("s3://"):
        from tba.objectstore.s3 import S3Store

        return S3Store(settings)
    from tba.objectstore.local import FileStore

    return FileStore(settings.uri)


__all__ = ["ObjectStore", "ObjectStoreSettings", "open_object_store"]
