"""`tba buffer serve`: the replay-buffer service."""

from __future__ import annotations

import asyncio

from tba.buffer.access import redact_url
from tba.buffer.config import BufferServeSettings, BufferSettings
from tba.cli import Flag
from tba.settings import CommandSettings

HELP = "Run the replay-buffer service (gRPC for searchers and trainer, REST for people)."


SETTINGS = BufferServeSettings
# Shown in `--help` as the example of `--set`.
SET_EXAMPLE = "buffer.capacity=100000"
FLAGS = (
    Flag("--store", "buffer.store", "`memory` (default) or redis://HOST:PORT/DB", metavar="URL"),
    Flag("--grpc-port", "buffer.grpc_port", "gRPC port (0 picks a free one)", metavar="PORT"),
    Flag("--http-port", "buffer.http_port", "REST port (0 picks a free one)", metavar="PORT"),
    Flag("--grpc-host", "buffer.grpc_host", "gRPC bind address", metavar="HOST"),
    Flag("--http-host", "buffer.http_host", "REST bind address", metavar="HOST"),
)


def announce_ready(settings: BufferSettings, grpc_port: int, http_port: int) -> None:
    url = f"http://{settings.http_host}:{http_port}"
    print(
        f"buffer service ready: grpc {settings.grpc_host}:{grpc_port}, http {url} "
        f"(dashboard {url}/, stats {url}/v1/stats, API docs {url}/docs), "
        f"store {redact_url(settings.store)}",
        flush=True,
    )


def run(settings: CommandSettings) -> None:
    assert isinstance(settings, BufferServeSettings)
    from tba.buffer.server import serve

    buffer = settings.buffer
    asyncio.run(serve(buffer, lambda g, h: announce_ready(buffer, g, h)))
