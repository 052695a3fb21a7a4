"""Starts the services of a one-machine run as child processes and stops them together.

Children run in their own session, so a Ctrl-C in the terminal reaches only this process,
which then stops them in reverse start order (SIGTERM, then SIGKILL after a grace period).
On Linux each child also gets SIGKILL if this process dies, so no orphan survives a crash.
"""

from __future__ import annotations

import ctypes
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

log = logging.getLogger(__name__)
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


@dataclass
class Child:
    name: str
    proc: subprocess.Popen[str]
    log_path: Path
    lines: list[str] = field(default_factory=list)

    def wait_for_line(self, pattern: str, timeout_s: float) -> re.Match[str]:
        """Blocks until the child prints a line matching `pattern`."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout_s
        seen = 0
        while time.monotonic() < deadline:
            for line in self.lines[seen:]:
                match = regex.search(line)
                if match:
                    return match
            seen = len(self.lines)
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError(f"{self.name} did not become ready; see {self.log_path}")


class Supervisor:
    def __init__(self, log_dir: Path, grace_s: float = 10.0) -> None:
        self.log_dir = log_dir
        self.grace_s = grace_s
        self.children: list[Child] = []

    def start(self, name: str, argv: Sequence[str], env: dict[str, str] | None = None) -> Child:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{name}.log"
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, **(env or {})},
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        child = Child(name, proc, log_path)
        assert proc.stdout is not None
        threading.Thread(
            target=_tee, args=(proc.stdout, log_path, child.lines), daemon=True
        ).start()
        self.children.append(child)
        log.info("started %s (pid %d), log %s", name, proc.pid, log_path)
        return child

    def failed(self) -> Child | None:
        """A child that has exited with an error, if any."""
        return next((c for c in self.children if c.proc.poll() not in (None, 0)), None)

    def stop_all(self) -> None:
        """Stops children one at a time in reverse start order, so that clients (trainer,
        searchers) finish their last calls while the buffer still serves them."""
        for child in reversed(self.children):
            if child.proc.poll() is not None:
                continue
            child.proc.send_signal(signal.SIGTERM)
            try:
                child.proc.wait(timeout=self.grace_s)
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop in %.0f s: killing it", child.name, self.grace_s)
                child.proc.kill()
                child.proc.wait()


def _tee(stream: IO[str], log_path: Path, lines: list[str]) -> None:
    with log_path.open("a") as out:
        for line in stream:
            out.write(line)
            out.flush()
            lines.append(line)
