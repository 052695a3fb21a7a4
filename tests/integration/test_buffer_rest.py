"""The buffer's REST API through a real uvicorn, with httpx."""

import re

import httpx
import pytest

from tba.buffer.config import BufferClientSettings
from tba.buffer.transport.grpc_client import BufferClient
from tba.domain import new_request_id
from tba.errors import InvalidArgumentError
from tests.fixtures.buffer_service import start_buffer
from tests.fixtures.data import trajectory


@pytest.fixture
def http(buffer_service):
    with httpx.Client(base_url=buffer_service.http_url, timeout=10) as client:
        yield client


def test_submitted_prompts_join_the_pool_searchers_lease(http, buffer_service):
    reply = http.post("/v1/prompts", json={"prompts": [{"text": "3+4=", "answer": "7"}]})
    assert reply.status_code == 200, reply.text
    (prompt_id,) = reply.json()["prompt_ids"]
    with BufferClient(BufferClientSettings(address=buffer_service.address)) as client:
        lease = client.lease_prompts("s1", 5)
        assert [(p.id, p.text, p.answer) for p in lease.prompts] == [(prompt_id, "3+4=", "7")]
        client.add_trajectories(
            [trajectory(prompt_id, reward=1.0)],
            searcher_id="s1",
            request_id=new_request_id(),
            lease_id=lease.lease_id,
        )
    stats = http.get("/v1/stats").json()
    assert stats["trajectories"] == 1 and stats["prompts"] == 1
    assert stats["reward_mean"] == 1.0
    assert sum(stats["reward_histogram"]["counts"]) == 1
    assert stats["per_version"] == {"0": 1}
    assert stats["searchers"][0]["searcher_id"] == "s1"


@pytest.mark.parametrize(
    "body",
    [
        b"{not json",
        b'{"prompts": []}',
        b'{"prompts": [{"text": ""}]}',
        b'{"prompts": [{"answer": "1"}]}',
        b'{"prompts": "x"}',
    ],
)
def test_bad_prompt_bodies_are_422_with_a_message_and_store_nothing(http, body):
    reply = http.post("/v1/prompts", content=body, headers={"content-type": "application/json"})
    assert reply.status_code == 422
    assert reply.json()["detail"]
    assert http.get("/v1/stats").json()["prompts"] == 0


def test_whitespace_prompt_is_refused_by_the_service(http):
    reply = http.post("/v1/prompts", json={"prompts": [{"text": "   "}]})
    assert reply.status_code == 422
    assert "empty" in reply.json()["detail"]


def test_over_size_body_is_413(tmp_path):
    service = start_buffer(tmp_path, "--set", "buffer.max_message_bytes=1048576")
    try:
        body = {"prompts": [{"text": "x" * 2_000_000}]}
        reply = httpx.post(f"{service.http_url}/v1/prompts", json=body, timeout=10)
        assert reply.status_code == 413
        stats = httpx.get(f"{service.http_url}/v1/stats", timeout=10).json()
        assert stats["prompts"] == 0
    finally:
        service.stop()


def test_weights_health_metrics_and_docs(http):
    assert http.get("/v1/weights").json() == {
        "available": False,
        "version": 0,
        "uri": "",
        "sha256": "",
        "step": 0,
        "published_at_s": 0.0,
    }
    assert http.get("/healthz").json() == {"status": "ok"}
    metrics = http.get("/metrics")
    assert metrics.status_code == 200
    assert "tba_buffer_trajectories 0.0" in metrics.text
    assert "tba_buffer_trajectories_added_total" in metrics.text
    assert http.get("/docs").status_code == 200
    paths = http.get("/openapi.json").json()["paths"]
    assert {"/v1/prompts", "/v1/stats", "/v1/weights"} <= set(paths)


def _handled(http: httpx.Client, method: str) -> float:
    pattern = rf'^tba_buffer_rpc_handling_seconds_count\{{method="{method}"\}} (\S+)$'
    found = re.search(pattern, http.get("/metrics").text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def test_metrics_count_each_grpc_call_with_its_handling_time(http, buffer_service):
    """Every call is timed, a refused one too (INVALID_ARGUMENT for a lease of 0 prompts)."""
    before = _handled(http, "LeasePrompts")
    with BufferClient(BufferClientSettings(address=buffer_service.address)) as client:
        client.lease_prompts("s1", 1)
        with pytest.raises(InvalidArgumentError):
            client.lease_prompts("s1", 0)
    assert _handled(http, "LeasePrompts") == before + 2
    text = http.get("/metrics").text
    assert "# TYPE tba_buffer_rpc_handling_seconds histogram" in text
    assert 'tba_buffer_rpc_handling_seconds_bucket{le="+Inf",method="LeasePrompts"}' in text
