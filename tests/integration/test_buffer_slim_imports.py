"""The buffer service and its gRPC client load no torch, transformers or vLLM: the buffer's
image and a client's process stay small and start fast. Each check runs in a fresh
interpreter, since this one has imported torch long before."""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("torch", "transformers", "vllm")
CHECK = f"""
import importlib, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
print(" ".join(sorted(m for m in {HEAVY!r} if m in sys.modules)))
"""

SERVICE = (
    # What `tba buffer serve` goes through: the CLI, the command, the server it starts.
    "tba.cli",
    "tba.buffer.main",
    "tba.buffer.server",
    "tba.buffer.service",
    "tba.buffer.store",
    "tba.buffer.memory_store",
    "tba.buffer.redis_store",
    "tba.buffer.transport.grpc_server",
    "tba.buffer.transport.rest",
)
CLIENT = ("tba.buffer.transport.grpc_client",)


@pytest.mark.parametrize("modules", [SERVICE, CLIENT], ids=["service", "grpc-client"])
def test_importing_the_buffer_loads_no_torch(modules):
    done = subprocess.run(
        [sys.executable, "-c", CHECK, *modules], capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "", f"{modules} imported {done.stdout.strip()}"
