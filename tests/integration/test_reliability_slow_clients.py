"""Slow and hostile HTTP clients against a real buffer service, over raw sockets: connections
that send nothing or their headers a byte at a time are closed after the header timeout, a
body that stops coming gets 408, a write without the token is refused before its body is
read (and the rest of it is not waited for beyond the body timeout), a chunked body over the
limit gets 413, connections beyond the cap get 503, and accepted connections get
TCP_NODELAY (the kept-alive latency it saves is a row of `python -m bench buffer`, not a timed
assertion)."""

from __future__ import annotations

import asyncio
import re
import socket
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import httpx
import pytest

from tba.buffer.config import MIB
from tba.buffer.server import bind_tcp
from tests.fixtures.buffer_service import BufferProcess, serve_with_a_clean_log

TOKEN = "tba-test-token-0123456789abcdef"
HEADER_S = 2.0
BODY_S = 2.0
MAX_CONNECTIONS = 4
SLACK_S = 5.0  # a loaded machine may answer late, never early


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BufferProcess]:
    args = ["--set", f"buffer.http_header_timeout_s={HEADER_S}"]
    args += ["--set", f"buffer.http_body_timeout_s={BODY_S}"]
    args += ["--set", f"buffer.http_max_connections={MAX_CONNECTIONS}"]
    args += ["--set", f"buffer.max_message_bytes={MIB}"]
    log_path = tmp_path_factory.mktemp("buffer") / "buffer.log"
    yield from serve_with_a_clean_log(args, log_path, {"TBA_BUFFER__AUTH_TOKEN": TOKEN})


def connect(service: BufferProcess) -> socket.socket:
    url = urlsplit(service.http_url)
    assert url.hostname is not None and url.port is not None
    return socket.create_connection((url.hostname, url.port), timeout=10)


def seconds_until_closed(sock: socket.socket, trickle: bytes = b"") -> tuple[float, int]:
    """Seconds until the server closes `sock`, while sending `trickle` a byte every 0.2 s;
    and how many bytes of it went out."""
    begin, sent = time.monotonic(), 0
    sock.settimeout(0.2)
    while time.monotonic() - begin < max(HEADER_S, BODY_S) + SLACK_S:
        try:
            if sent < len(trickle):
                sock.sendall(trickle[sent : sent + 1])
                sent += 1
            if sock.recv(65_536) == b"":
                return time.monotonic() - begin, sent
        except TimeoutError:
            continue
        except (ConnectionResetError, BrokenPipeError):
            return time.monotonic() - begin, sent
    raise AssertionError("the server kept the connection open")


def read_reply(sock: socket.socket) -> tuple[int, bytes]:
    """Status and lower-cased head of the next response on `sock`, its body read too."""
    sock.settimeout(HEADER_S + BODY_S + SLACK_S)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65_536)
        assert chunk, f"closed without a reply: {data!r}"
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    head = head.lower()
    length = re.search(rb"content-length: (\d+)", head)
    while length is not None and len(body) < int(length.group(1)):
        body += sock.recv(65_536)
    return int(head.split(b" ", 2)[1]), head


def head(method: str, path: str, *lines: str) -> bytes:
    return "\r\n".join([f"{method} {path} HTTP/1.1", "Host: buffer", *lines, "", ""]).encode()


def test_a_connection_that_sends_nothing_is_closed(service):
    with connect(service) as sock:
        elapsed, _ = seconds_until_closed(sock)
    print(f"\nsilent connection closed after {elapsed:.2f} s (header timeout {HEADER_S} s)")
    assert HEADER_S - 0.1 <= elapsed < HEADER_S + SLACK_S


def test_headers_sent_a_byte_at_a_time_are_cut_off(service):
    trickle = head("GET", "/v1/stats", "X-Slow: " + "a" * 100)
    with connect(service) as sock:
        elapsed, sent = seconds_until_closed(sock, trickle)
    print(f"\nheaders a byte per 0.2 s: closed after {elapsed:.2f} s, {sent} bytes in")
    assert HEADER_S - 0.1 <= elapsed < HEADER_S + SLACK_S
    assert sent < len(trickle), "the client was still sending when it was cut off"


def test_a_body_that_stops_coming_is_408_and_closed(service):
    request = head("POST", "/v1/prompts", "Content-Length: 100", f"Authorization: Bearer {TOKEN}")
    with connect(service) as sock:
        begin = time.monotonic()
        sock.sendall(request + b"{")
        status, headers = read_reply(sock)
        elapsed = time.monotonic() - begin
        assert seconds_until_closed(sock)[0] < SLACK_S
    print(f"\n1 of 100 body bytes: {status} after {elapsed:.2f} s (body timeout {BODY_S} s)")
    assert status == 408 and b"connection: close" in headers
    assert BODY_S - 0.1 <= elapsed < BODY_S + SLACK_S


def test_a_write_without_the_token_is_refused_before_its_body(service):
    """Answered at once; the body the client sends on is discarded unread, and only for the
    body timeout: then the connection closes."""
    request = head("POST", "/v1/prompts", "Content-Length: 1000000")
    with connect(service) as sock:
        begin = time.monotonic()
        sock.sendall(request)
        status, headers = read_reply(sock)
        answered_s = time.monotonic() - begin
        closed_s, sent = seconds_until_closed(sock, trickle=b" " * 1000)
    print(
        f"\nno token, 1 MB declared, none sent: {status} after {answered_s * 1000:.0f} ms; "
        f"closed {closed_s:.2f} s later with {sent} more bytes sent"
    )
    assert status == 401 and b"www-authenticate: bearer" in headers
    assert answered_s < BODY_S, "it waited for the body"
    assert BODY_S - 0.1 <= closed_s < BODY_S + SLACK_S and sent < 1000


def test_a_chunked_body_over_the_limit_is_413(service):
    request = head(
        "POST",
        "/v1/prompts",
        "Content-Type: application/json",
        "Transfer-Encoding: chunked",
        f"Authorization: Bearer {TOKEN}",
    )
    chunk = b"%x\r\n%s\r\n" % (65_536, b" " * 65_536)
    with connect(service) as sock:
        sock.sendall(request)
        for _ in range(2 * MIB // 65_536):
            sock.sendall(chunk)
        status, _ = read_reply(sock)
    assert status == 413
    assert httpx.get(f"{service.http_url}/v1/stats", timeout=10).json()["prompts"] == 0


def test_connections_beyond_the_cap_get_503(service):
    idle = [connect(service) for _ in range(MAX_CONNECTIONS)]
    try:
        time.sleep(0.2)  # the server has taken them
        with connect(service) as extra:
            extra.sendall(head("GET", "/v1/stats"))
            status, headers = read_reply(extra)
        assert status == 503 and b"connection: close" in headers
    finally:
        for sock in idle:
            sock.close()
    time.sleep(0.2)
    assert httpx.get(f"{service.http_url}/v1/stats", timeout=10).status_code == 200


def test_accepted_rest_connections_have_tcp_nodelay():
    async def accepted_nodelay() -> int:
        sock = bind_tcp("127.0.0.1", 0)
        found: list[int] = []

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            option = writer.get_extra_info("socket").getsockopt(
                socket.IPPROTO_TCP, socket.TCP_NODELAY
            )
            found.append(option)
            writer.close()

        server = await asyncio.start_server(handle, sock=sock)
        async with server:
            reader, writer = await asyncio.open_connection(*sock.getsockname())
            await reader.read()
            writer.close()
        return found[0]

    assert asyncio.run(accepted_nodelay()) != 0
