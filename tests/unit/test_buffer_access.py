"""The token check, URL redaction and secret handling of the buffer's settings, and that every
REST route that writes asks for the token."""

from __future__ import annotations

import pydantic
import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

from tba.buffer.access import bearer_authorizes, bearer_header, redact_url
from tba.buffer.config import BufferClientSettings, BufferServeSettings, BufferSettings
from tba.buffer.memory_store import MemoryStore
from tba.buffer.server import store_limits
from tba.buffer.service import BufferService
from tba.buffer.transport.rest import create_app
from tba.settings import load_settings

TOKEN = SecretStr("a-long-shared-token-1234")


@pytest.mark.parametrize(
    ("header", "ok"),
    [
        ("Bearer a-long-shared-token-1234", True),
        ("bearer a-long-shared-token-1234", True),
        ("Bearer  a-long-shared-token-1234 ", True),
        (None, False),
        ("", False),
        ("a-long-shared-token-1234", False),
        ("Basic a-long-shared-token-1234", False),
        ("Bearer a-long-shared-token-123", False),
        ("Bearer a-long-shared-token-12345", False),
        ("Bearer ", False),
    ],
)
def test_bearer_authorizes_only_the_token(header, ok):
    assert bearer_authorizes(header, TOKEN) is ok


def test_bearer_header_round_trips():
    assert bearer_authorizes(bearer_header(TOKEN), TOKEN)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("memory", "memory"),
        ("redis://redis:6379/0", "redis://redis:6379/0"),
        ("redis://:hunter2@redis:6379/0", "redis://***@redis:6379/0"),
        ("redis://tba:hunter2@redis:6379/0", "redis://***@redis:6379/0"),
        ("rediss://tba:p%40ss@redis.example:6380/1", "rediss://***@redis.example:6380/1"),
        ("redis://redis:6379/0?password=hunter2&db=1", "redis://redis:6379/0?password=***&db=1"),
    ],
)
def test_redact_url_hides_credentials(url, shown):
    assert redact_url(url) == shown


def test_tokens_are_hidden_in_dumps_and_errors(monkeypatch):
    monkeypatch.setenv("TBA_BUFFER__AUTH_TOKEN", "short-secret")
    with pytest.raises(pydantic.ValidationError) as refused:
        load_settings(BufferServeSettings)
    assert "auth_token" in str(refused.value) and "short-secret" not in str(refused.value)
    monkeypatch.setenv("TBA_BUFFER__AUTH_TOKEN", TOKEN.get_secret_value())
    settings = load_settings(BufferServeSettings)
    assert settings.buffer.auth_token == TOKEN
    assert TOKEN.get_secret_value() not in settings.to_toml() + repr(settings)
    client = BufferClientSettings(auth_token=TOKEN)
    assert TOKEN.get_secret_value() not in repr(client) + str(client.model_dump(mode="json"))


def test_tls_files_come_as_a_pair(tmp_path):
    with pytest.raises(pydantic.ValidationError, match="together"):
        BufferSettings(tls_cert_file=tmp_path / "cert.pem")
    settings = BufferSettings(tls_cert_file=tmp_path / "c.pem", tls_key_file=tmp_path / "k.pem")
    assert settings.tls_key_file == tmp_path / "k.pem"


def _app(token: SecretStr | None) -> TestClient:
    settings = BufferSettings(auth_token=token)
    service = BufferService(MemoryStore(store_limits(settings)), settings)
    return TestClient(create_app(service))


def test_every_rest_route_that_writes_needs_the_token():
    client = _app(TOKEN)
    writes = [
        (method, route.path)
        for route in client.app.routes  # type: ignore[attr-defined]
        for method in getattr(route, "methods", set()) - {"GET", "HEAD"}
    ]
    assert ("POST", "/v1/prompts") in writes
    for method, path in writes:
        reply = client.request(method, path, json={"prompts": [{"text": "1+1="}]})
        assert reply.status_code == 401, (method, path)
        assert reply.headers["www-authenticate"] == "Bearer"
    body = {"prompts": [{"text": "1+1="}]}
    headers = {"Authorization": bearer_header(TOKEN)}
    assert client.post("/v1/prompts", json=body, headers=headers).status_code == 200


def test_without_a_token_writes_are_open():
    reply = _app(None).post("/v1/prompts", json={"prompts": [{"text": "1+1="}]})
    assert reply.status_code == 200
