"""One background thread that handles the newest item only: the trainer's weight snapshots on
their way to the object store.

At most one item is handled at a time. An item handed over while another is being handled
waits; a newer one replaces the waiting one, which is counted in `skipped` and never handled.
An exception the handler lets out stops the thread and is raised in the caller's thread by the
next `submit` or `drain`, so a bug is not buried in a thread (the handler catches what it
counts as a failed publish itself).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class NewestOnlyWorker(Generic[T]):
    def __init__(self, handle: Callable[[T], None], name: str) -> None:
        self._handle = handle
        self._changed = threading.Condition()
        self._waiting: T | None = None
        self._busy = False
        self._closed = False
        self._error: BaseException | None = None
        self.skipped = 0
        # A daemon: a trainer that ends on an error does not wait for an upload, and an upload
        # cut short leaves an unfinished version, which no reader trusts (as after kill -9).
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, item: T) -> None:
        """Hands `item` over; it replaces an item still waiting (counted in `skipped`)."""
        with self._changed:
            self._raise_error()
            if self._closed:
                raise RuntimeError("the worker is closed")
            if self._waiting is not None:
                self.skipped += 1
            self._waiting = item
            self._changed.notify_all()

    def drain(self) -> None:
        """Waits until nothing waits and nothing is being handled."""
        with self._changed:
            self._changed.wait_for(
                lambda: self._error is not None or (self._waiting is None and not self._busy)
            )
            self._raise_error()

    def close(self, wait: bool = True) -> None:
        """Stops taking items; a waiting one is dropped. With `wait`, joins the thread (after
        the item being handled, if any)."""
        with self._changed:
            self._closed = True
            self._waiting = None
            self._changed.notify_all()
        if wait:
            self._thread.join()

    def _raise_error(self) -> None:
        if self._error is not None:
            raise RuntimeError("the publisher thread failed") from self._error

    def _run(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._waiting is not None or self._closed)
                if self._waiting is None:
                    return
                item, self._waiting = self._waiting, None
                self._busy = True
            try:
                self._handle(item)
            except BaseException as exc:
                with self._changed:
                    self._error = exc
                return
            finally:
                with self._changed:
                    self._busy = False
                    self._changed.notify_all()
