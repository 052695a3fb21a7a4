"""Publishing the engine's weights to an object store and announcing them to the buffer.

An unreachable store (`UnavailableError`: the store or the network to it down) does not end
the run: the publish is retried with backoff, and the version is announced only once it is
whole. Each attempt first drops the manifest of an unfinished earlier attempt at the same
version (one that stopped before `LATEST` named it, so never announced), so the version is
written again whole; an attempt that stopped after writing `LATEST` only finishes retention.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tba.domain import WeightVersion
from tba.errors import UnavailableError
from tba.objectstore import ObjectStore
from tba.objectstore.weights import (
    MANIFEST,
    apply_retention,
    publish_weights,
    read_latest,
    version_key,
)
from tba.retry import Backoff, retry
from tba.trainer.engine import TrainEngine

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


class StorePublisher:
    """Every rank calls `publish` (ZeRO-3 gathers weights collectively); rank 0 writes the
    version (retrying while the store is unreachable) and announces it, and every rank gets
    the announced `WeightVersion`."""

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
    ) -> None:
        self.store = store
        self.engine = engine
        self.tokenizer = tokenizer
        self.announce = announce
        self.keep_versions = keep_versions
        self.retries = retries
        self.retry_backoff_s = retry_backoff_s
        self.sleep = sleep

    def publish(self, version: int, step: int) -> WeightVersion:
        state_dict = self.engine.publish_state_dict()
        weights = None
        if self.engine.rank == 0:
            weights = self._write(_Attempts(version, step, state_dict))
            self.announce(weights)
        announced = self.engine.broadcast(weights)
        assert announced is not None
        return announced

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
        )
