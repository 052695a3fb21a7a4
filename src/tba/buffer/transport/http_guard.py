"""The REST server's defences against hostile and slow clients, in the two places that see a
request before the app does: the HTTP protocol (deadlines on the request line and headers, and
on a refused body's remainder) and an ASGI layer in front of the app (the token on writes
before any body byte is read, then a deadline and a size limit on the body, however it is
framed)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import h11
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from tba.errors import ResourceExhaustedError, TbaError, UnauthenticatedError

# Reads stay open; every other method may change the buffer.
READ_METHODS = frozenset({"GET", "HEAD"})
UNAUTHENTICATED = "writes need `Authorization: Bearer TOKEN` with the buffer's auth_token"


class DeadlineProtocol(H11Protocol):
    """uvicorn's h11 protocol with two deadlines uvicorn lacks (it bounds only the idle time
    between requests, and no longer once a byte arrives): `header_timeout_s` for a request
    head, from the connection or the previous response on, so that a client sending nothing,
    or its headers a byte at a time, cannot hold a connection; and `body_timeout_s` for the
    rest of a body the app refused without reading, which h11 discards as it comes (closing
    at once could lose the answer to a client still sending). Past either: closed."""

    header_timeout_s = 10.0
    body_timeout_s = 30.0
    _deadline: asyncio.TimerHandle | None = None
    _waiting_for: str | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._follow_state()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._follow_state()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._follow_state()

    def connection_lost(self, exc: Exception | None) -> None:
        self._set_deadline(None, 0.0)
        super().connection_lost(exc)

    def _follow_state(self) -> None:
        their, ours = self.conn.their_state, self.conn.our_state
        if their is h11.IDLE:
            self._set_deadline("head", self.header_timeout_s)
        elif their is h11.SEND_BODY and ours is h11.DONE:
            self._set_deadline("discarded body", self.body_timeout_s)
        else:
            self._set_deadline(None, 0.0)

    def _set_deadline(self, waiting_for: str | None, timeout_s: float) -> None:
        """A new deadline whenever what the server waits for changes; none while it waits
        for nothing (the app has the request)."""
        if waiting_for == self._waiting_for:
            return
        if self._deadline is not None:
            self._deadline.cancel()
        self._waiting_for = waiting_for
        self._deadline = None
        if waiting_for is not None:
            self._deadline = self.loop.call_later(timeout_s, self.transport.close)


def deadline_protocol(header_timeout_s: float, body_timeout_s: float) -> type[DeadlineProtocol]:
    """The protocol class uvicorn instantiates per connection, with this server's deadlines."""
    deadlines = {"header_timeout_s": header_timeout_s, "body_timeout_s": body_timeout_s}
    return type("Deadlines", (DeadlineProtocol,), deadlines)


class RequestGuard:
    """ASGI layer in front of the REST app. Refuses a write without the token (`authorizes`)
    before reading its body, then reads the whole body within `body_timeout_s` (else 408,
    and the connection closes) and up to `max_body_bytes` (413 whether Content-Length
    declares more or a chunked body grows past it), and hands the app the body read.
    `refuse` renders domain errors (the HTTP status mapping of `rest`); the rest of a refused
    body is the protocol's to discard."""

    def __init__(
        self,
        app: ASGIApp,
        max_body_bytes: int,
        body_timeout_s: float,
        authorizes: Callable[[str | None], bool] | None,
        refuse: Callable[[TbaError], Response],
    ) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s
        self.authorizes = authorizes
        self.refuse = refuse

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            self._check_token(scope)
            async with asyncio.timeout(self.body_timeout_s):
                body = await self._read_body(scope, receive)
        except TbaError as exc:
            await self.refuse(exc)(scope, receive, send)
            return
        except TimeoutError:
            detail = f"request body not received within {self.body_timeout_s:g} s"
            headers = {"connection": "close"}  # a client this slow gets no second request
            await JSONResponse({"detail": detail}, 408, headers)(scope, receive, send)
            return
        if body is not None:  # None: the client has gone
            await self.app(scope, _replay(body, receive), send)

    def _check_token(self, scope: Scope) -> None:
        if self.authorizes is None or scope["method"] in READ_METHODS:
            return
        header = _header(scope, b"authorization")
        if not self.authorizes(header.decode("latin-1") if header is not None else None):
            raise UnauthenticatedError(UNAUTHENTICATED)

    async def _read_body(self, scope: Scope, receive: Receive) -> bytes | None:
        too_large = ResourceExhaustedError(f"request body over {self.max_body_bytes} bytes")
        declared = _header(scope, b"content-length")
        if declared is not None and int(declared) > self.max_body_bytes:
            raise too_large
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                raise too_large
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


def _header(scope: Scope, name: bytes) -> bytes | None:
    return next((value for key, value in scope["headers"] if key == name), None)


def _replay(body: bytes, receive: Receive) -> Receive:
    """The app's `receive`: the body already read, then the client's own events (only a
    disconnect can follow a whole body)."""
    pending = True

    async def replay() -> Message:
        nonlocal pending
        if pending:
            pending = False
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
