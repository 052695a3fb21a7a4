"""Runs the buffer service: one store, one BufferService, the gRPC and the REST server in
one asyncio loop, until SIGINT/SIGTERM."""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
from collections.abc import Callable

import uvicorn

from tba.buffer.access import NO_TOKEN_WARNING
from tba.buffer.config import BufferSettings
from tba.buffer.history import max_points
from tba.buffer.metrics import HandlingTimes
from tba.buffer.service import BufferService
from tba.buffer.store import StoreLimits, open_buffer_store
from tba.buffer.transport.grpc_server import start_grpc_server
from tba.buffer.transport.http_guard import deadline_protocol
from tba.buffer.transport.rest import create_app
from tba.errors import UnavailableError
from tba.heap import freeze_startup_objects

log = logging.getLogger(__name__)
_GRACE_S = 5.0


def store_limits(settings: BufferSettings) -> StoreLimits:
    return StoreLimits(
        capacity=settings.capacity,
        prompt_history=settings.prompt_history,
        dedup=settings.dedup,
        request_id_ttl_s=settings.request_id_ttl_s,
        reward_histogram_edges=tuple(settings.reward_histogram_edges),
        history_span_s=settings.history_span_s,
        history_max_points=max_points(settings.history_span_s, settings.history_interval_s),
    )


def bind_tcp(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on accepted sockets whose protocol
    # says TCP, and without it Nagle and delayed ACK add 40 ms to each kept-alive request.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    return sock


def http_server(service: BufferService, handling: HandlingTimes | None = None) -> uvicorn.Server:
    """uvicorn with the REST app, deadlines on slow clients and a cap on connections."""
    settings = service.settings
    config = uvicorn.Config(
        create_app(service, handling),
        log_level="warning",
        lifespan="off",
        http=deadline_protocol(settings.http_header_timeout_s, settings.http_body_timeout_s),
        # uvicorn counts the new connection too: one more serves exactly the maximum.
        limit_concurrency=settings.http_max_connections + 1,
    )
    return uvicorn.Server(config)


async def record_history(service: BufferService) -> None:
    """Appends a history point every `history_interval_s` until cancelled; a store that
    cannot be reached costs that point, not the service."""
    while True:
        await asyncio.sleep(service.settings.history_interval_s)
        try:
            await service.record_history()
        except UnavailableError as exc:
            log.warning("history point skipped: %s", exc)


async def serve(
    settings: BufferSettings, on_ready: Callable[[int, int], None] | None = None
) -> None:
    """Serves until cancelled or signalled; `on_ready(grpc_port, http_port)` once listening."""
    if settings.auth_token is None:
        log.warning(NO_TOKEN_WARNING)
    store = open_buffer_store(settings.store, settings.key_prefix, store_limits(settings))
    service = BufferService(store, settings)
    handling = HandlingTimes()
    grpc_server = await start_grpc_server(service, settings, handling)
    http_socket = bind_tcp(settings.http_host, settings.http_port)
    http_port = http_socket.getsockname()[1]
    http = http_server(service, handling)
    http_task = asyncio.create_task(http.serve(sockets=[http_socket]))
    history_task = asyncio.create_task(record_history(service))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    while not http.started and not http_task.done():
        await asyncio.sleep(0.01)
    freeze_startup_objects()
    if on_ready is not None:
        on_ready(grpc_server.port, http_port)
    try:
        await asyncio.wait(
            [asyncio.create_task(stop.wait()), http_task], return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        log.info("buffer service stopping")
        history_task.cancel()
        http.should_exit = True
        await grpc_server.stop(_GRACE_S)
        await http_task
        await store.close()
