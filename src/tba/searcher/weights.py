"""Hot-reloading weights on a searcher without pausing generation for the download. When the
buffer announces a version newer than the engine's, one background thread downloads it from
the object store (every file verified against its sha256) into `weights_dir/v{version}` and
has the engine prepare it (the transformers engine reads its tensors into memory) while the
loop generates with the old weights; the loop's next `check`, between rounds, swaps it in.
The swap is all the pause a new version costs generation.

At most one download is in flight: versions announced meanwhile are not queued, the newest
announced one is fetched after it (and the one fetched is swapped in first). A fetch or swap
that fails keeps the weights the engine has: a version deleted by retention (NotFoundError)
is followed by the newest announced one at once; a download that fails or does not verify is
logged and tried again by the check after the one that saw it fail (a newer version announced
meanwhile at once). After each fetch only the newest `keep_versions`
local folders stay on disk, and the one the engine holds.
"""

from __future__ import annotations

import logging
import re
import shutil
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from tba.domain import WeightVersion
from tba.errors import NotFoundError, TbaError
from tba.objectstore import ObjectStore
from tba.objectstore.weights import fetch_weights
from tba.searcher.engine import PreparedWeights

log = logging.getLogger(__name__)
_VERSION_DIR = re.compile(r"^v(\d+)$")


class LatestWeights(Protocol):
    def __call__(self, newer_than: int = 0, wait_s: float = 0.0) -> WeightVersion | None:
        """The latest announced version; with `wait_s`, once one newer than `newer_than` is
        announced or `wait_s` has passed."""
        ...


class ReloadableEngine(Protocol):
    @property
    def version(self) -> int: ...

    def prepare_weights(self, weights_dir: Path) -> PreparedWeights: ...

    def swap_weights(self, prepared: PreparedWeights, version: int) -> None: ...


@dataclass(frozen=True)
class WeightSwap:
    """A version swapped in between rounds: `swap_s` paused generation; `fetch_s` (download,
    verification, preparation) ran beside it; `reload_s` is from the check that saw the
    version announced to the end of its swap."""

    version: int
    step: int
    swap_s: float
    fetch_s: float
    reload_s: float


@dataclass(frozen=True)
class _Fetched:
    announced: WeightVersion
    prepared: PreparedWeights
    seen_at_s: float
    fetch_s: float


@dataclass(frozen=True)
class _InFlight:
    announced: WeightVersion
    future: Future[_Fetched]


class WeightSync:
    def __init__(
        self,
        latest: LatestWeights,
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
        self._in_flight: _InFlight | None = None
        # One worker: at most one download (and one prepared copy of the weights) at a time.
        self._fetcher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="searcher-weights")

    def check(self) -> WeightSwap | None:
        """Between rounds: swaps in the version fetched in the background, if one is ready,
        then starts fetching the newest announced version if the engine is behind it and no
        fetch is in flight. Never waits for a download. The swap, or None (nothing ready, or
        a failure: logged)."""
        fetched, failed = self._collect()
        swap = None
        if fetched is not None:
            swap = self._swap(fetched)
            failed = None if swap is not None else fetched.announced.version
        # A version that just failed is tried again by the next check, not at once: a wait for
        # a version (`min_version`) then retries every `idle_poll_s`, not in a tight loop.
        self._start_fetch(retry_later=failed)
        return swap

    def wait_fetch(self, timeout_s: float | None) -> bool:
        """Blocks until the fetch in flight, if any, is ready or has failed, for at most
        `timeout_s` (None: no limit); whether one was in flight."""
        if self._in_flight is None:
            return False
        wait([self._in_flight.future], timeout=timeout_s)
        return True

    def wait_announce(self, timeout_s: float) -> bool:
        """With no fetch in flight: blocks until a version newer than any seen is announced,
        for at most `timeout_s` (the buffer holds the call), and starts fetching it; whether
        one was. A version whose fetch failed is fetched again once this wait ends."""
        if self._in_flight is not None:
            return False
        seen = self.latest_version
        announced = self.latest(seen, timeout_s)
        self._fetch_newer(announced, retry_later=None)
        return announced is not None and announced.version > seen

    def catch_up(self) -> None:
        """At start: fetches the newest announced version and swaps it in, waiting for the
        download (a failure is logged and retried by the next check)."""
        self.check()
        self.wait_fetch(None)
        self.check()

    def close(self) -> None:
        """Waits for the fetch in flight, if any, and stops the fetcher thread; nothing is
        swapped in after."""
        self._fetcher.shutdown(wait=True, cancel_futures=True)

    def _collect(self) -> tuple[_Fetched | None, int | None]:
        """The fetch in flight once it is done: what it prepared, or the version that failed
        (logged); (None, None) while it runs or with none."""
        in_flight = self._in_flight
        if in_flight is None or not in_flight.future.done():
            return None, None
        self._in_flight = None
        version = in_flight.announced.version
        try:
            return in_flight.future.result(), None
        except NotFoundError as exc:
            # Deleted by retention: the trainer has announced a newer version since.
            log.warning("weight version %d is gone (%s); fetching the latest", version, exc)
        except (TbaError, OSError) as exc:
            log.warning(
                "could not fetch weight version %d (%s); keeping version %d, retrying on the "
                "next check",
                version,
                exc,
                self.engine.version,
            )
        return None, version

    def _start_fetch(self, retry_later: int | None) -> None:
        self._fetch_newer(self.latest(), retry_later)

    def _fetch_newer(self, announced: WeightVersion | None, retry_later: int | None) -> None:
        if announced is None:
            return
        self.latest_version = max(self.latest_version, announced.version)
        newer = announced.version > self.engine.version
        if self._in_flight is None and newer and announced.version != retry_later:
            future = self._fetcher.submit(self._fetch, announced, self.clock())
            self._in_flight = _InFlight(announced, future)

    def _fetch(self, announced: WeightVersion, seen_at_s: float) -> _Fetched:
        """On the fetcher thread, beside generation: download, verify, prepare, prune."""
        started = self.clock()
        local = self.weights_dir / f"v{announced.version}"
        try:
            fetch_weights(self.store, announced, local)
            prepared = self.engine.prepare_weights(local)
        except BaseException:
            shutil.rmtree(local, ignore_errors=True)
            raise
        self._prune()
        return _Fetched(announced, prepared, seen_at_s, self.clock() - started)

    def _swap(self, fetched: _Fetched) -> WeightSwap | None:
        announced = fetched.announced
        started = self.clock()
        try:
            self.engine.swap_weights(fetched.prepared, announced.version)
        except (TbaError, OSError) as exc:
            log.warning(
                "could not load weight version %d (%s); keeping version %d, retrying on the "
                "next check",
                announced.version,
                exc,
                self.engine.version,
            )
            shutil.rmtree(fetched.prepared.weights_dir, ignore_errors=True)
            return None
        done = self.clock()
        swap = WeightSwap(
            announced.version,
            announced.step,
            done - started,
            fetched.fetch_s,
            done - fetched.seen_at_s,
        )
        log.info(
            "loaded weight version %d (trainer step %d) in %.3f s, fetched beside generation in "
            "%.2f s",
            swap.version,
            swap.step,
            swap.swap_s,
            swap.fetch_s,
        )
        return swap

    def _prune(self) -> None:
        """Deletes local version folders beyond the newest `keep_versions`, never the one the
        engine holds (which cannot change meanwhile: a swap only follows a finished fetch)."""
        found = {}
        for path in self.weights_dir.iterdir():
            match = _VERSION_DIR.match(path.name)
            if match and path.is_dir():
                found[int(match.group(1))] = path
        keep = set(sorted(found)[-self.keep_versions :]) | {self.engine.version}
        for version, path in found.items():
            if version not in keep:
                shutil.rmtree(path, ignore_errors=True)
