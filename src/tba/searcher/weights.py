"""Hot-reloading weights on a searcher: when the buffer announces a version newer than the
engine's, download it from the object store (every file verified against its sha256) into
`weights_dir/v{version}` and load it into the engine.

A reload that fails keeps the weights the engine has: a version deleted by retention
(NotFoundError) is followed by the newest announced one at once; a download that fails or does
not verify is logged and tried again on the next check. Only the newest `keep_versions` local
folders stay on disk.
"""

from __future__ import annotations

import logging
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from tba.domain import WeightVersion
from tba.errors import NotFoundError, TbaError
from tba.objectstore import ObjectStore
from tba.objectstore.weights import fetch_weights

log = logging.getLogger(__name__)
_VERSION_DIR = re.compile(r"^v(\d+)$")


class ReloadableEngine(Protocol):
    @property
    def version(self) -> int: ...

    def load_weights(self, weights_dir: Path, version: int) -> None: ...


class WeightSync:
    def __init__(
        self,
        latest: Callable[[], WeightVersion | None],
        store: ObjectStore,
        engine: ReloadableEngine,
        weights_dir: Path,
        keep_versions: int = 2,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.latest = latest
        self.store = store
        self.engine = engine
        self.weights_dir = weights_dir
        self.keep_versions = keep_versions
        self.clock = clock
        self.latest_version = 0
        self.last_reload_s = 0.0

    def check(self) -> float | None:
        """Loads the newest announced version if the engine is behind it; the seconds the
        reload took, or None when nothing was loaded (up to date, or a failure: logged)."""
        for _ in range(2):
            announced = self._newer_announced()
            if announced is None:
                return None
            try:
                return self._reload(announced)
            except NotFoundError as exc:
                # Deleted by retention: the trainer has announced a newer version since.
                log.warning(
                    "weight version %d is gone (%s); reading the latest", announced.version, exc
                )
            except (TbaError, OSError) as exc:
                log.warning(
                    "could not load weight version %d (%s); keeping version %d, retrying on "
                    "the next check",
                    announced.version,
                    exc,
                    self.engine.version,
                )
                return None
        return None

    def _newer_announced(self) -> WeightVersion | None:
        announced = self.latest()
        if announced is None:
            return None
        self.latest_version = max(self.latest_version, announced.version)
        return announced if announced.version > self.engine.version else None

    def _reload(self, announced: WeightVersion) -> float:
        started = self.clock()
        local = self.weights_dir / f"v{announced.version}"
        try:
            fetch_weights(self.store, announced, local)
            self.engine.load_weights(local, announced.version)
        except BaseException:
            shutil.rmtree(local, ignore_errors=True)
            raise
        self._prune()
        self.last_reload_s = self.clock() - started
        log.info(
            "loaded weight version %d (trainer step %d) in %.2f s",
            announced.version,
            announced.step,
            self.last_reload_s,
        )
        return self.last_reload_s

    def _prune(self) -> None:
        """Deletes local version folders beyond the newest `keep_versions`, never the one the
        engine holds."""
        found = {}
        for path in self.weights_dir.iterdir():
            match = _VERSION_DIR.match(path.name)
            if match and path.is_dir():
                found[int(match.group(1))] = path
        keep = set(sorted(found)[-self.keep_versions :]) | {self.engine.version}
        for version, path in found.items():
            if version not in keep:
                shutil.rmtree(path, ignore_errors=True)
