"""Publishing the engine's weights to an object store and announcing them to the buffer.

Each publish starts with a snapshot (`take_snapshot`): a copy of the weights on the CPU in the
export dtype (`[model] dtype`: bf16 halves the bytes), taken between optimizer steps so it is
one consistent set of weights. Then the snapshot is written (save_pretrained for the first
version, its tensors alone with safetensors after that where `VersionFiles` can; sha256
manifest, `LATEST`, retention) and announced, either at once (`background=False`: the step
waits, a publish that fails after its retries stops the trainer) or on a publisher thread while
training goes on (at most one publish in flight; a newer snapshot replaces one still waiting,
counted as skipped; a publish that fails after its retries is counted and logged, and the next
snapshot is published). The version number is taken when a snapshot is written, so versions
stay dense and increasing whatever is skipped.

An unreachable store (`UnavailableError`: the store or the network to it down) does not end
the run: the publish is retried with backoff, and the version is announced only once it is
whole. Each attempt first drops the manifest of an unfinished earlier attempt at the same
version (one that stopped before `LATEST` named it, so never announced), so the version is
written again whole; an attempt that stopped after writing `LATEST` only finishes retention.
A version that failed is written again by the next snapshot, under the same number.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch

from tba.domain import WeightVersion
from tba.errors import TbaError, UnavailableError
from tba.objectstore import ObjectStore
from tba.objectstore.version_files import VersionFiles
from tba.objectstore.weights import (
    MANIFEST,
    apply_retention,
    publish_weights,
    read_latest,
    version_key,
)
from tba.retry import Backoff, retry
from tba.trainer.engine import TrainEngine
from tba.trainer.publish_worker import NewestOnlyWorker

log = logging.getLogger(__name__)
MAX_RETRY_BACKOFF_S = 15.0


class PublishFailedError(UnavailableError):
    """The object store stayed unreachable through every retry of a publish."""


@dataclass
class _Attempts:
    """One version on its way to the store, over as many attempts as the store needs."""

    version: int
    step: int
    state_dict: Mapping[str, Any] | None
    # The version `LATEST` named when an attempt first read it (0: none), so a later attempt
    # can tell its own `LATEST` from one that was there before.
    latest_at_start: int | None = None


@dataclass(frozen=True)
class Snapshot:
    """The weights after optimizer step `step`: CPU tensors in the export dtype."""

    step: int
    state_dict: dict[str, torch.Tensor]


def take_snapshot(weights: Mapping[str, torch.Tensor], step: int, dtype: torch.dtype) -> Snapshot:
    """Copies `weights` to the CPU, floating tensors cast to `dtype`; tensors that share
    storage (tied embeddings) share one copy, as they did."""
    copies: dict[tuple[int, torch.dtype, tuple[int, ...]], torch.Tensor] = {}
    state: dict[str, torch.Tensor] = {}
    for name, tensor in weights.items():
        key = (tensor.data_ptr(), tensor.dtype, tuple(tensor.shape))
        if key not in copies:
            target = dtype if tensor.is_floating_point() else tensor.dtype
            copies[key] = tensor.detach().to(device="cpu", dtype=target, copy=True)
        state[name] = copies[key]
    return Snapshot(step, state)


@dataclass(frozen=True)
class PublishProgress:
    """What the publisher has done so far (on rank 0; other ranks know only what a
    synchronous publish broadcast)."""

    announced: WeightVersion | None = None  # the newest version announced
    skipped: int = 0  # snapshots replaced before they were written
    failed: int = 0  # publishes that failed after their retries (background only)
    background_s: float = 0.0  # seconds the latest finished background publish took


class StorePublisher:
    """Every rank calls `publish` (ZeRO-3 gathers weights collectively); rank 0 writes the
    version (retrying while the store is unreachable) and announces it."""

    def __init__(
        self,
        store: ObjectStore,
        engine: TrainEngine,
        tokenizer: Any,
        announce: Callable[[WeightVersion], None],
        keep_versions: int,
        retries: int = 0,
        retry_backoff_s: float = 1.0,
        sleep: Callable[[float], None] = time.sleep,
        *,
        export_dtype: torch.dtype = torch.float32,
        background: bool = False,
    ) -> None:
        self.store = store
        self.engine = engine
        self.tokenizer = tokenizer
        self.announce = announce
        self.keep_versions = keep_versions
        self.retries = retries
        self.retry_backoff_s = retry_backoff_s
        self.sleep = sleep
        self.export_dtype = export_dtype
        self.background = background
        self._next_version = 1
        self._files = VersionFiles(engine.model, tokenizer)
        # A version whose write failed: the next snapshot is written under its number.
        self._unfinished: _Attempts | None = None
        self._progress = PublishProgress()
        self._worker: NewestOnlyWorker[tuple[Snapshot, int]] | None = None
        if background and engine.rank == 0:
            self._worker = NewestOnlyWorker(self._publish_in_background, "tba-publisher")

    def publish(self, step: int, after_version: int) -> None:
        """Publishes the current weights (those after `step`) as a version newer than
        `after_version` and announces them: at once, or handed to the publisher thread."""
        weights = self.engine.publish_state_dict()
        if weights is None:
            weights = self.engine.model.state_dict()
        snapshot = None
        if self.engine.rank == 0:
            snapshot = take_snapshot(weights, step, self.export_dtype)
        if self.background:
            # Only rank 0 has a publisher thread; the others' part was the gather.
            if self._worker is not None and snapshot is not None:
                self._worker.submit((snapshot, after_version))
            return
        announced = None
        if snapshot is not None:
            announced = self._write_and_announce(snapshot, after_version)
        announced = self.engine.broadcast(announced)
        assert announced is not None
        self._progress = replace(self._progress, announced=announced)

    def progress(self) -> PublishProgress:
        skipped = self._worker.skipped if self._worker is not None else 0
        return replace(self._progress, skipped=skipped)

    def drain(self) -> PublishProgress:
        """Waits until every snapshot handed over is announced, skipped or failed."""
        if self._worker is not None:
            self._worker.drain()
        return self.progress()

    def close(self, wait: bool = True) -> None:
        if self._worker is not None:
            self._worker.close(wait)

    def _publish_in_background(self, handed: tuple[Snapshot, int]) -> None:
        snapshot, after_version = handed
        started_s = time.monotonic()
        try:
            announced = self._write_and_announce(snapshot, after_version)
        except (TbaError, OSError) as exc:
            failed = self._progress.failed + 1
            self._progress = replace(self._progress, failed=failed)
            log.error(
                "publishing the weights of step %d failed (%s); training goes on, the next "
                "snapshot is published (%d failed so far)",
                snapshot.step,
                exc,
                failed,
            )
        else:
            self._progress = replace(self._progress, announced=announced)
        finally:
            elapsed_s = time.monotonic() - started_s
            self._progress = replace(self._progress, background_s=elapsed_s)

    def _write_and_announce(self, snapshot: Snapshot, after_version: int) -> WeightVersion:
        """Writes `snapshot` as the next version after `after_version` and any this publisher
        wrote (or as the version whose write failed last time) and announces it. Raises
        PublishFailedError, keeping that version's number for the next snapshot."""
        self._next_version = max(self._next_version, after_version + 1)
        attempts = self._unfinished or _Attempts(self._next_version, snapshot.step, None)
        attempts.step, attempts.state_dict = snapshot.step, snapshot.state_dict
        self._unfinished = attempts
        weights = self._write(attempts)
        self._unfinished = None
        self._next_version = weights.version + 1
        self.announce(weights)
        if weights.step != snapshot.step:
            # The failed write had landed whole after all (LATEST named it, the reply was
            # lost): that version is announced, and this snapshot becomes the next.
            return self._write_and_announce(snapshot, after_version)
        return weights

    def _write(self, attempts: _Attempts) -> WeightVersion:
        """Writes the version, retrying `UnavailableError` with backoff (doubling up to
        `MAX_RETRY_BACKOFF_S`); raises PublishFailedError once the retries are spent."""
        started_s = time.monotonic()

        def log_retry(exc: Exception, number: int, wait_s: float) -> None:
            log.warning(
                "publishing weight version %d failed (%s), retry %d of %d in %.1f s",
                attempts.version,
                exc,
                number,
                self.retries,
                wait_s,
            )

        try:
            return retry(
                lambda: self._attempt(attempts),
                Backoff(
                    retries=self.retries, first_s=self.retry_backoff_s, max_s=MAX_RETRY_BACKOFF_S
                ),
                retry_on=lambda exc: isinstance(exc, UnavailableError),
                on_retry=log_retry,
                sleep=self.sleep,
            )
        except UnavailableError as exc:
            raise PublishFailedError(
                f"could not publish weight version {attempts.version} to "
                f"{self.store.uri}: the store stayed unreachable through {self.retries} "
                f"retries over {time.monotonic() - started_s:.1f} s ({exc})"
            ) from exc

    def _attempt(self, attempts: _Attempts) -> WeightVersion:
        latest = read_latest(self.store)
        latest_version = latest.version if latest is not None else 0
        if attempts.latest_at_start is None:
            attempts.latest_at_start = latest_version
        if latest is not None and latest_version == attempts.version > attempts.latest_at_start:
            # An earlier attempt wrote LATEST, then lost the store (in retention, or before
            # its reply came back): the version is whole.
            apply_retention(self.store, self.keep_versions)
            return latest
        if latest_version < attempts.version:
            # Not yet named by LATEST, so never announced: an unfinished earlier attempt
            # (this one's, or a killed trainer's) is dropped and the version written whole.
            self.store.delete(f"{version_key(attempts.version)}/{MANIFEST}")
        return publish_weights(
            self.store,
            attempts.version,
            attempts.step,
            self.engine.model,
            self.tokenizer,
            keep_last=self.keep_versions,
            state_dict=attempts.state_dict,
            files_of=self._files,
        )
