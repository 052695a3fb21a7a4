"""The buffer service restarted on the same Redis finds every accepted prompt and trajectory,
and its history."""

import signal
import time

import httpx

from tba.buffer.config import BufferClientSettings
from tba.buffer.transport.grpc_client import BufferClient
from tba.domain import Prompt, SampleSpec, WeightVersion, new_request_id
from tests.fixtures.buffer_service import start_buffer, wait_for_history
from tests.fixtures.data import trajectory


def _client(address):
    return BufferClient(BufferClientSettings(address=address, retries=20, retry_backoff_s=0.2))


def test_restarted_service_finds_everything_accepted(redis_server, tmp_path):
    service = start_buffer(tmp_path, "--store", redis_server.url)
    try:
        with _client(service.address) as client:
            ids = client.put_prompts([Prompt("", f"{i}+1=", str(i + 1)) for i in range(20)])
            accepted = 0
            for n, pid in enumerate(ids.prompt_ids):
                batch = [trajectory(pid, completion=[n, k], reward=k) for k in range(5)]
                accepted += client.add_trajectories(
                    batch, searcher_id="s1", request_id=new_request_id()
                ).accepted
            client.announce_weights(WeightVersion(3, "file:///w/3", "b" * 64, 6, time.time()))
            before = client.stats()
        service.restart(signal.SIGKILL)
        with _client(service.address) as client:
            after = client.stats()
            assert after.trajectories == accepted == 100
            assert after.prompts == 20
            assert after.trajectories_added_total == before.trajectories_added_total
            assert after.reward_histogram_counts == before.reward_histogram_counts
            latest = client.latest_weights()
            assert latest is not None and latest.version == 3
            batch = client.sample(SampleSpec(20, 5, 0.5))
            assert {g.prompt.id for g in batch.groups} == set(ids.prompt_ids)
            assert sum(len(g.trajectories) for g in batch.groups) == 100
            lease = client.lease_prompts("s2", 100)
            assert len(lease.prompts) == 20
    finally:
        service.stop()


def test_restarted_service_keeps_its_history(redis_server, tmp_path):
    service = start_buffer(
        tmp_path, "--store", redis_server.url, "--set", "buffer.history_interval_s=0.2"
    )
    try:
        body = {"version": 1, "step": 2, "metrics": {"accuracy": 0.5}}
        assert httpx.post(f"{service.http_url}/v1/evaluations", json=body).status_code == 200
        before = wait_for_history(service.http_url, 3)
        service.restart(signal.SIGKILL)
        after = wait_for_history(service.http_url, len(before) + 1)
        assert after[: len(before)] == before
        assert any(p["evaluation"] == body for p in after)
    finally:
        service.stop()
