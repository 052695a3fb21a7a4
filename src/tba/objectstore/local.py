"""`file://` object store: keys are files under a root directory.

Every write goes to a temporary file in the target's directory and is renamed into place, so
a key is replaced atomically (POSIX rename) and a crash leaves no partial object behind.

Objects are never written in place, only replaced, which lets `put_file` and `get_file` hard
link instead of copying when both paths are on one filesystem: publishing and fetching a
multi-GB weights file then costs no copy. The price is the contract stated in `ObjectStore`:
callers replace such files, never write into them.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path

from tba.errors import InvalidArgumentError, NotFoundError
from tba.objectstore.base import check_key

_TMP_PREFIX = ".tmp-"


class FileStore:
    def __init__(self, uri: str) -> None:
        self._uri = uri.rstrip("/")
        self.root = Path(uri.removeprefix("file://"))
        self.root.mkdir(parents=True, exist_ok=True)

    @property
    def uri(self) -> str:
        return self._uri

    def put_bytes(self, key: str, data: bytes) -> None:
        self._atomic_write(key, lambda tmp: tmp.write_bytes(data))

    def put_file(self, key: str, path: Path) -> None:
        target = self._path(key)
        _make_parent(target)
        _link_or_copy(path, target)

    def get_bytes(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except (FileNotFoundError, IsADirectoryError) as exc:
            raise NotFoundError(f"no object {key} in {self.uri}") from exc

    def get_file(self, key: str, path: Path) -> None:
        source = self._path(key)
        if not source.is_file():
            raise NotFoundError(f"no object {key} in {self.uri}")
        _link_or_copy(source, path)

    def list(self, prefix: str = "") -> list[str]:
        # Walk only the folder the prefix names: each publish's retention lists the versions
        # and then each version it deletes, which used to walk the whole store every time.
        folder = prefix.rpartition("/")[0]
        try:
            start = self._path(folder) if folder else self.root
        except InvalidArgumentError:  # no key lies under a folder that is not a key
            return []
        keys = []
        for dirpath, _, filenames in os.walk(start):
            for name in filenames:
                if name.startswith(_TMP_PREFIX):
                    continue
                key = (Path(dirpath) / name).relative_to(self.root).as_posix()
                if key.startswith(prefix):
                    keys.append(key)
        return sorted(keys)

    def delete(self, key: str) -> None:
        path = self._path(key)
        path.unlink(missing_ok=True)
        # Empty folders left by deletes would pile up as versions rotate.
        for parent in path.parents:
            if parent == self.root or not parent.is_relative_to(self.root):
                break
            try:
                parent.rmdir()
            except OSError:
                break

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

    def _atomic_write(self, key: str, write: Callable[[Path], object]) -> None:
        target = self._path(key)
        _make_parent(target)
        _replace_atomically(target, write)


def _make_parent(target: Path) -> None:
    # A stat where the folder exists, which is every file of a version but its first: on
    # ext4 a mkdir that fails costs several times as much.
    if not target.parent.is_dir():
        target.parent.mkdir(parents=True, exist_ok=True)


def _link_or_copy(source: Path, target: Path) -> None:
    try:
        # A new name appears whole at once; only an existing one needs the rename below.
        os.link(source, target)
        return
    except FileExistsError:
        pass  # replaced through a new name below
    except OSError:  # another filesystem, or links not supported
        _replace_atomically(target, lambda t: shutil.copyfile(source, t))
        return
    tmp = target.with_name(f"{_TMP_PREFIX}{uuid.uuid4().hex}")
    try:
        os.link(source, tmp)
    except OSError:
        _replace_atomically(target, lambda t: shutil.copyfile(source, t))
        return
    os.replace(tmp, target)


def _replace_atomically(target: Path, write: Callable[[Path], object]) -> None:
    fd, name = tempfile.mkstemp(prefix=_TMP_PREFIX, dir=target.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        write(tmp)
        # mkstemp makes files private; searchers may read the store as another user.
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
