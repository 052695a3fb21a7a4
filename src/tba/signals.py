"""SIGTERM and Ctrl-C as an event that a service's wait or loop checks, so that it ends
cleanly (a round posted, a wait left) instead of being cut off where it stands."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

log = logging.getLogger(__name__)


@contextmanager
def stop_on_signals(then: str = "stopping") -> Iterator[threading.Event]:
    """An event SIGTERM and Ctrl-C set while inside (logged as `signal N: <then>`) instead of
    ending the process; the previous handlers come back on leaving."""
    stop = threading.Event()

    def handle(signum: int, frame: FrameType | None) -> None:
        log.info("signal %d: %s", signum, then)
        stop.set()

    previous = {sig: signal.signal(sig, handle) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
