"""The unit tier runs in this process alone: a test that binds a port or starts a process
fails here and belongs in tests/integration."""

from __future__ import annotations

import multiprocessing.process
import os
import socket
import subprocess
from collections.abc import Iterator
from typing import Any, NoReturn

import grpc
import pytest


def _refuse(what: str) -> Any:
    def refused(*args: Any, **kwargs: Any) -> NoReturn:
        raise RuntimeError(f"a unit test {what}: move it to tests/integration")

    return refused


@pytest.fixture(autouse=True)
def no_ports_or_processes(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(socket.socket, "bind", _refuse("binds a socket"))
    # gRPC's core binds its ports in C, out of the socket module's sight.
    monkeypatch.setattr(grpc, "server", _refuse("starts a gRPC server"))
    # Every subprocess.run / Popen / asyncio subprocess goes through _execute_child.
    monkeypatch.setattr(subprocess.Popen, "_execute_child", _refuse("starts a subprocess"))
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", _refuse("starts a process"))
    monkeypatch.setattr(os, "fork", _refuse("forks"))
    yield
