"""Starts the services of a one-machine run as child processes and stops them together.

A child is a new program (`start`) or a fork of this process that runs a function (`fork`):
a fork inherits the modules this process has imported, so a service that needs torch and
transformers starts in a fraction of a second instead of importing them again for seconds.
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
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Protocol

log = logging.getLogger(__name__)
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class Process(Protocol):
    """What the supervisor uses of a child process: `subprocess.Popen`'s names."""

    pid: int

    @property
    def returncode(self) -> int | None: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def send_signal(self, sig: int) -> None: ...

    def kill(self) -> None: ...


class ForkedProcess:
    """A child forked from this process, waited for as `subprocess.Popen` waits: its return
    code is its exit status, or minus the signal that ended it."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._returncode: int | None = None

    @property
    def returncode(self) -> int | None:
        return self._returncode

    def poll(self) -> int | None:
        if self._returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid == self.pid:
                self._returncode = os.waitstatus_to_exitcode(status)
        return self._returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0.0)
            time.sleep(0.02)
        assert self._returncode is not None
        return self._returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


@dataclass
class Child:
    name: str
    proc: Process
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
        assert proc.stdout is not None
        return self._follow(name, proc, proc.stdout, log_path)

    def fork(
        self, name: str, main: Callable[[], object], env: dict[str, str] | None = None
    ) -> Child:
        """Forks this process into a child that runs `main` with `env` added to its
        environment, then exits: 0 when `main` returns, as `sys.exit` says when it raises
        SystemExit, 1 (its traceback logged) on any other exception. The child keeps only the
        thread that forked: fork from the main thread, and only while no other thread holds
        what the child needs (a pool of torch threads, a network connection, a lock)."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{name}.log"
        read_fd, write_fd = os.pipe()
        # Output still buffered here would be written a second time by the child.
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            os.close(read_fd)
            _run_forked(main, write_fd, env or {})
        os.close(write_fd)
        return self._follow(name, ForkedProcess(pid), open(read_fd), log_path)

    def _follow(self, name: str, proc: Process, output: IO[str], log_path: Path) -> Child:
        """Copies the child's output into its log (and `Child.lines`) on a thread."""
        child = Child(name, proc, log_path)
        threading.Thread(target=_tee, args=(output, log_path, child.lines), daemon=True).start()
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


def _run_forked(main: Callable[[], object], output_fd: int, env: dict[str, str]) -> None:
    """The forked child's whole life: set up as `start`'s children are, run `main`, exit
    without this process's exit handlers (they belong to the parent)."""
    code: int = 1
    try:
        os.setsid()
        _die_with_parent()
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(output_fd, 1)
        os.dup2(output_fd, 2)
        os.close(devnull)
        os.close(output_fd)
        # New streams on the pipe, buffered as a new process's are (the parent's may not
        # write to its descriptors 1 and 2 at all: pytest's capture, say).
        sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", buffering=1, closefd=False, errors="backslashreplace")  # noqa: SIM115
        os.environ.update(env)
        # As a new Python process starts: the parent's handlers would act for the parent.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        # The child configures its own logging, as a new process would.
        logging.root.handlers.clear()
        main()
        code = 0
    except SystemExit as exc:
        code = _exit_code(exc)
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _exit_code(exc: SystemExit) -> int:
    """The status `sys.exit(arg)` gives a Python process (a message goes to stderr)."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


def _tee(stream: IO[str], log_path: Path, lines: list[str]) -> None:
    with log_path.open("a") as out:
        for line in stream:
            out.write(line)
            out.flush()
            lines.append(line)
