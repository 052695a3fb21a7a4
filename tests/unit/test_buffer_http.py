"""The REST app without a server (TestClient, or the ASGI app called as uvicorn would): JSON
numbers must be finite, the token is checked before a body is read, a body has a size and a
time limit however it comes, and the OpenAPI schema is true to the configuration and to the
id rules."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import given
from hypothesis import strategies as st
from pydantic import SecretStr

from tba.buffer.access import bearer_header
from tba.buffer.config import MIB, BufferSettings
from tba.buffer.memory_store import MemoryStore
from tba.buffer.server import store_limits
from tba.buffer.service import BufferService
from tba.buffer.transport.rest import ID_PATTERN, create_app, finite_json
from tba.buffer.validation import check_id
from tba.errors import InvalidArgumentError

TOKEN = SecretStr("a-long-shared-token-1234")
JSON = {"content-type": "application/json"}


def _service(**fields: Any) -> BufferService:
    settings = BufferSettings(**fields)
    return BufferService(MemoryStore(store_limits(settings)), settings)


def _client(**fields: Any) -> TestClient:
    return TestClient(create_app(_service(**fields)))


NON_FINITE = ["NaN", "Infinity", "-Infinity", "1e999", "-1e999", "1E400"]
PLACES = [
    '{"prompts": [{"text": %s}]}',
    '{"prompts": [{"text": "1+1=", "answer": %s}]}',
    '{"prompts": [{"text": "1+1=", "id": %s}]}',
    '{"prompts": [{"text": "1+1=", "unknown": %s}]}',
    '{"prompts": [%s]}',
    '{"prompts": %s}',
    "%s",
    '{"prompts": [{"text": "1+1="}], "more": [1, {"deep": %s}]}',
]


@pytest.mark.parametrize("number", NON_FINITE)
@pytest.mark.parametrize("place", PLACES)
def test_non_finite_numbers_are_422_with_a_message(place, number):
    client = _client()
    reply = client.post("/v1/prompts", content=place % number, headers=JSON)
    assert reply.status_code == 422, reply.text
    (error,) = reply.json()["detail"]
    assert f"{number} is not a finite number" in error["ctx"]["error"]
    assert client.get("/v1/stats").json()["prompts"] == 0


def test_finite_json_parses_what_json_allows():
    text = b'{"a": 1.5, "b": -1e308, "c": 123456789012345678901234567890, "d": [0, -0.0]}'
    assert finite_json(text) == json.loads(text)
    with pytest.raises(json.JSONDecodeError, match="finite"):
        finite_json(b"[1, 2e308]")


def _scope(method: str, path: str, headers: dict[str, str]) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
        "server": ("127.0.0.1", 8080),
        "client": ("127.0.0.1", 40000),
    }


class Exchange:
    """One request through the ASGI app; `receive` hands out `chunks` (the last one ends the
    body unless `stalls`), then waits forever, as a client that stopped sending would."""

    def __init__(self, headers: dict[str, str], chunks: list[bytes], stalls: bool = False):
        self.scope = _scope("POST", "/v1/prompts", {**JSON, **headers})
        self.chunks = chunks
        self.stalls = stalls
        self.reads = 0
        self.sent: list[dict[str, Any]] = []

    async def receive(self) -> dict[str, Any]:
        self.reads += 1
        if self.reads > len(self.chunks):
            await asyncio.Event().wait()
        more = self.stalls or self.reads < len(self.chunks)
        return {"type": "http.request", "body": self.chunks[self.reads - 1], "more_body": more}

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)

    def run(self, service: BufferService) -> tuple[int, dict[bytes, bytes]]:
        app = create_app(service)
        asyncio.run(asyncio.wait_for(app(self.scope, self.receive, self.send), 10))
        start = self.sent[0]
        return start["status"], dict(start["headers"])


@pytest.mark.parametrize("authorization", [None, "Bearer wrong-token-123456"])
def test_a_write_without_the_token_is_refused_before_its_body_is_read(authorization):
    headers = {"content-length": str(50_000_000)}
    if authorization is not None:
        headers["authorization"] = authorization
    exchange = Exchange(headers, [b'{"prompts": [{"text": "1+1="}]}'])
    status, reply_headers = exchange.run(_service(auth_token=TOKEN))
    assert (status, exchange.reads) == (401, 0)
    assert reply_headers[b"www-authenticate"] == b"Bearer"


def test_a_chunked_body_over_the_limit_is_413():
    client = _client(max_message_bytes=MIB)
    chunks = iter([b"[" + b" " * 65_536] * 17)  # no Content-Length: sent chunked
    reply = client.post("/v1/prompts", content=chunks, headers=JSON)
    assert reply.status_code == 413
    assert f"over {MIB} bytes" in reply.json()["detail"]


def test_a_body_that_stops_coming_is_408_and_closes():
    exchange = Exchange({"content-length": "100"}, [b"{"], stalls=True)
    status, reply_headers = exchange.run(_service(http_body_timeout_s=0.2))
    assert status == 408
    assert reply_headers[b"connection"] == b"close"
    assert b"0.2 s" in exchange.sent[1]["body"]


def test_a_slow_body_within_the_limit_reaches_the_app():
    body = b'{"prompts": [{"text": "1+1=", "id": "q1"}]}'
    chunks = [body[i : i + 5] for i in range(0, len(body), 5)]
    exchange = Exchange({"authorization": bearer_header(TOKEN)}, chunks)
    status, _ = exchange.run(_service(auth_token=TOKEN))
    assert status == 200
    assert json.loads(exchange.sent[1]["body"]) == {"prompt_ids": ["q1"], "created": 1}


@pytest.mark.parametrize("token", [None, TOKEN], ids=["open", "token"])
def test_the_schema_declares_the_token_only_when_there_is_one(token):
    schema = _client(auth_token=token).get("/openapi.json").json()
    put = schema["paths"]["/v1/prompts"]["post"]
    if token is None:
        assert "security" not in put and "401" not in put["responses"]
        assert "securitySchemes" not in schema.get("components", {})
    else:
        assert put["security"] == [{"HTTPBearer": []}]
        assert "401" in put["responses"]
        assert schema["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    assert {"408", "413", "422"} <= put["responses"].keys()


def test_the_schema_states_the_configured_limits_and_the_id_rules():
    schema = _client(max_prompts_per_call=7, max_text_chars=99).get("/openapi.json").json()
    models = schema["components"]["schemas"]
    assert models["PutPromptsIn"]["properties"]["prompts"]["maxItems"] == 7
    prompt = models["PromptIn"]["properties"]
    assert prompt["text"]["maxLength"] == prompt["answer"]["maxLength"] == 99
    assert prompt["text"]["pattern"] == r"\S"
    assert (prompt["id"]["pattern"], prompt["id"]["maxLength"]) == (ID_PATTERN, 128)


def _accepted(value: str) -> bool:
    try:
        check_id(value, "id", required=False)
    except InvalidArgumentError:
        return False
    return True


def _matches_id_pattern(value: str) -> bool:
    """As JSON Schema (ECMA-262) reads the pattern: its `$` is the end of the text, where
    Python's also matches before a final newline."""
    return re.fullmatch(ID_PATTERN, value) is not None


@given(st.text(max_size=12))
def test_every_id_the_service_accepts_matches_the_schema(value):
    if _accepted(value):
        assert _matches_id_pattern(value)


@given(st.text(st.characters(max_codepoint=0x7F), max_size=12))
def test_ascii_ids_match_the_schema_exactly_when_accepted(value):
    assert _matches_id_pattern(value) == _accepted(value)


def test_an_id_ending_in_a_newline_does_not_match_the_schema():
    assert not _matches_id_pattern("q1\n") and not _accepted("q1\n")


@given(st.text(max_size=8))
def test_text_matches_the_schema_exactly_when_not_only_whitespace(value):
    assert bool(re.search(r"\S", value)) == bool(value.strip())
