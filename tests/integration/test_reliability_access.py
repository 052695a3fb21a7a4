"""Who may talk to the buffer service, over real gRPC and HTTP: the shared token on every gRPC
call and every REST write, open health and metrics, TLS with a self-signed certificate, Redis
behind a password or an ACL user, and no secret in any log line or reply."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from pydantic import SecretStr

from tba.buffer.config import BufferClientSettings
from tba.buffer.transport.grpc_client import BufferClient
from tba.domain import Prompt, SampleSpec, WeightVersion, new_request_id
from tba.errors import UnauthenticatedError, UnavailableError
from tests.fixtures.buffer_service import BufferProcess
from tests.fixtures.data import trajectory
from tests.fixtures.redis_server import start_redis
from tests.fixtures.tls import self_signed

TOKEN = "tba-test-token-0123456789abcdef"
REDIS_PASSWORD = "redis-pw-9f8e7d6c5b4a"
OPEN_PATHS = ("/v1/stats", "/v1/weights", "/healthz", "/livez", "/metrics", "/", "/openapi.json")


def start_service(tmp_path: Path, *args: str, token: str | None = TOKEN) -> BufferProcess:
    # DEBUG: the most any log could say; the token comes by env, as in a deployment.
    tmp_path.mkdir(parents=True, exist_ok=True)
    env = {"TBA_LOG_LEVEL": "DEBUG"}
    if token is not None:
        env["TBA_BUFFER__AUTH_TOKEN"] = token
    service = BufferProcess(list(args), tmp_path / "buffer.log", env=env)
    service.start()
    return service


@pytest.fixture
def guarded(tmp_path: Path) -> Iterator[BufferProcess]:
    service = start_service(tmp_path)
    yield service
    service.stop()


def client(address: str, token: str | None = TOKEN, **fields: Any) -> BufferClient:
    secret = SecretStr(token) if token is not None else None
    settings = BufferClientSettings(address=address, retries=0, auth_token=secret, **fields)
    return BufferClient(settings)


CALLS: dict[str, Callable[[BufferClient], object]] = {
    "PutPrompts": lambda c: c.put_prompts([Prompt("", "1+1=", "2")]),
    "LeasePrompts": lambda c: c.lease_prompts("s1", 4),
    "AddTrajectories": lambda c: c.add_trajectories(
        [trajectory("p1")], searcher_id="s1", request_id=new_request_id()
    ),
    "Sample": lambda c: c.sample(SampleSpec(1, 1, 0.5)),
    "GetStats": lambda c: c.stats(),
    "AnnounceWeights": lambda c: c.announce_weights(
        WeightVersion(1, "file:///w", "a" * 64, 1, 0.0)
    ),
    "GetLatestWeights": lambda c: c.latest_weights(),
}


@pytest.mark.parametrize("token", [None, "wrong-token-0123456789", TOKEN[:-1]])
def test_every_grpc_call_without_the_token_is_unauthenticated(guarded, token):
    with client(guarded.address, token) as intruder:
        for call in CALLS.values():
            with pytest.raises(UnauthenticatedError, match="bearer token"):
                call(intruder)
    with client(guarded.address) as member:
        stats = member.stats()
        assert (stats.prompts, stats.trajectories, stats.latest_version) == (0, 0, 0)
        assert member.latest_weights() is None


def test_with_the_token_every_grpc_call_works(guarded):
    with client(guarded.address) as member:
        (pid,) = member.put_prompts([Prompt("", "1+1=", "2")]).prompt_ids
        lease = member.lease_prompts("s1", 4)
        added = member.add_trajectories(
            [trajectory(pid)],
            searcher_id="s1",
            request_id=new_request_id(),
            lease_id=lease.lease_id,
        )
        member.announce_weights(WeightVersion(1, "file:///w/1", "a" * 64, 1, time.time()))
        assert added.accepted == 1
        assert len(member.sample(SampleSpec(1, 1, 0.5)).groups) == 1
        assert member.stats().trajectories == 1
        assert member.latest_weights() is not None


def test_health_and_reflection_stay_open(guarded):
    with grpc.insecure_channel(guarded.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        reply = health.Check(health_pb2.HealthCheckRequest(service="tba.v1.ReplayBuffer"))
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        reply = next(iter(stub.ServerReflectionInfo(iter([request]), timeout=5)))
        assert "tba.v1.ReplayBuffer" in {s.name for s in reply.list_services_response.service}


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer wrong-token"}, {"Authorization": f"Basic {TOKEN}"}],
)
def test_rest_writes_without_the_token_are_401(guarded, headers):
    body = {"prompts": [{"text": "3+4=", "answer": "7"}]}
    reply = httpx.post(f"{guarded.http_url}/v1/prompts", json=body, headers=headers, timeout=10)
    assert reply.status_code == 401
    assert reply.headers["www-authenticate"] == "Bearer"
    assert "Bearer" in reply.json()["detail"]
    assert httpx.get(f"{guarded.http_url}/v1/stats", timeout=10).json()["prompts"] == 0


def test_rest_reads_stay_open_and_writes_work_with_the_token(guarded):
    with httpx.Client(base_url=guarded.http_url, timeout=10) as http:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        body = {"prompts": [{"text": "3+4=", "answer": "7"}]}
        assert http.post("/v1/prompts", json=body, headers=headers).status_code == 200
        for path in OPEN_PATHS:
            reply = http.get(path)
            assert reply.status_code == 200, path
            assert TOKEN not in reply.text, path
        security = http.get("/openapi.json").json()["components"]["securitySchemes"]
        assert security["HTTPBearer"]["scheme"] == "bearer"


def test_without_a_token_the_service_warns_once_at_start(tmp_path):
    open_service = start_service(tmp_path / "open", token=None)
    guarded = start_service(tmp_path / "guarded")
    try:
        with client(open_service.address, token=None) as anyone:
            assert anyone.put_prompts([Prompt("", "x")]).created == 1
    finally:
        open_service.stop()
        guarded.stop()
    warnings = open_service.log_path.read_text().count("unauthenticated")
    assert warnings == 1
    assert "unauthenticated" not in guarded.log_path.read_text()


def test_tls_with_a_self_signed_certificate(tmp_path):
    pair = self_signed(tmp_path / "tls")
    other = self_signed(tmp_path / "other-ca", name="someone-else")
    args = ("--set", f"buffer.tls_cert_file={pair.cert_file}")
    service = start_service(tmp_path, *args, "--set", f"buffer.tls_key_file={pair.key_file}")
    try:
        with client(service.address, tls_ca_file=pair.cert_file) as member:
            assert member.put_prompts([Prompt("", "over tls")]).created == 1
            assert member.stats().prompts == 1
        intruder = client(service.address, token=None, tls_ca_file=pair.cert_file)
        with intruder, pytest.raises(UnauthenticatedError):
            intruder.stats()
        for refused in ({}, {"tls_ca_file": other.cert_file}):
            wrong_channel = client(service.address, **refused)
            with wrong_channel, pytest.raises(UnavailableError):
                wrong_channel.stats()
    finally:
        service.stop()


def _secret_free(text: str, *secrets: str) -> bool:
    return not any(secret in text for secret in secrets)


@pytest.mark.parametrize("user", [None, "tba-buffer"], ids=["requirepass", "acl-user"])
def test_redis_behind_a_password_and_no_secret_in_any_log(tmp_path, user):
    redis = start_redis(tmp_path / "redis", password=REDIS_PASSWORD, username=user)
    service = start_service(tmp_path, "--store", redis.url)
    try:
        with client(service.address) as member:
            (pid,) = member.put_prompts([Prompt("", "1+1=", "2")]).prompt_ids
            assert (
                member.add_trajectories(
                    [trajectory(pid)], searcher_id="s1", request_id=new_request_id()
                ).accepted
                == 1
            )
            assert member.sample(SampleSpec(1, 1, 0.5)).groups[0].prompt.id == pid
            intruder = client(service.address, token="wrong-token-0123456789")
            with intruder, pytest.raises(UnauthenticatedError):
                intruder.stats()
            redis.kill()  # a failing store: its error must not name the password
            with pytest.raises(UnavailableError, match="cannot be reached") as down:
                member.stats()
            health = httpx.get(f"{service.http_url}/healthz", timeout=10)
            assert health.status_code == 503
            assert _secret_free(str(down.value) + health.text, REDIS_PASSWORD, TOKEN)
            redis.start()
            assert member.stats().trajectories == 1
    finally:
        service.stop()
        redis.kill()
    (ready,) = [line for line in service.stdout_lines if "ready" in line]
    assert f"redis://***@127.0.0.1:{redis.port}/0" in ready
    output = service.log_path.read_text() + "".join(service.stdout_lines)
    assert "DEBUG" in output  # the check below reads a verbose log
    assert _secret_free(output, REDIS_PASSWORD, TOKEN)


def test_a_wrong_redis_password_is_unavailable_not_a_crash(tmp_path):
    redis = start_redis(tmp_path / "redis", password=REDIS_PASSWORD)
    wrong_url = redis.url.replace(REDIS_PASSWORD, "not-the-password")
    service = start_service(tmp_path, "--store", wrong_url)
    try:
        with client(service.address) as member:
            with pytest.raises(UnavailableError) as refused:
                member.put_prompts([Prompt("", "x")])
            assert "not-the-password" not in str(refused.value)
        assert service.proc is not None and service.proc.poll() is None
    finally:
        service.stop()
        redis.kill()
