"""The object-store interface: a flat namespace of keys under one root URI.

Keys are relative, `/`-separated paths (`versions/v00000001/model.safetensors`). Writes of one
key are atomic: a reader sees the old object or the new one, never a partial one, which is what
lets weight publishing write the `LATEST` pointer last and have readers trust it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from tba.errors import InvalidArgumentError


class ObjectStore(Protocol):
    """What weight publishing and fetching need of a store. `NotFoundError` for missing keys,
    `UnavailableError` when the backend cannot be reached."""

    @property
    def uri(self) -> str:
        """The root URI, e.g. `file:///data/weights` or `s3://bucket/prefix`."""
        ...

    def put_bytes(self, key: str, data: bytes) -> None: ...

    def put_file(self, key: str, path: Path) -> None:
        """Stores the file's content. The store may keep a hard link to `path` (`file://`
        on one filesystem): replace that file afterwards, never write into it."""
        ...

    def get_bytes(self, key: str) -> bytes: ...

    def get_file(self, key: str, path: Path) -> None:
        """Puts the object at `path` (replacing it); its parent must exist. `path` may be a
        hard link to the stored object (`file://`): replace it, never write into it."""
        ...

    def list(self, prefix: str = "") -> list[str]:
        """Keys starting with `prefix`, sorted; `prefix` ends with `/` for a folder."""
        ...

    def delete(self, key: str) -> None:
        """Removes the key; a missing key is not an error."""
        ...

    def exists(self, key: str) -> bool: ...


def check_key(key: str) -> str:
    """Rejects keys that could escape the root or that stores disagree on."""
    parts = key.split("/")
    if not key or key.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise InvalidArgumentError(f"invalid object key {key!r}")
    return key


def join_uri(root: str, key: str) -> str:
    return f"{root.rstrip('/')}/{check_key(key)}"


def key_of(root: str, uri: str) -> str:
    """The key that `uri` names under `root`; raises if it lies elsewhere."""
    prefix = root.rstrip("/") + "/"
    if not uri.startswith(prefix):
        raise InvalidArgumentError(f"{uri} is not under the store root {root}")
    return check_key(uri[len(prefix) :].rstrip("/"))
