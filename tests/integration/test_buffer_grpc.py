"""The buffer service over real gRPC, with the real client."""

import concurrent.futures
import math
import time
import uuid

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tba.buffer.config import BufferClientSettings
from tba.buffer.transport.grpc_client import BufferClient
from tba.domain import (
    Prompt,
    SampleSource,
    SampleSpec,
    WeightVersion,
    new_request_id,
    pack_logprobs,
)
from tba.errors import FailedPreconditionError, InvalidArgumentError, ResourceExhaustedError
from tests.fixtures.buffer_service import start_buffer
from tests.fixtures.data import trajectory, with_token_logprobs

SHA = "a" * 64


@pytest.fixture
def client(buffer_address):
    with BufferClient(BufferClientSettings(address=buffer_address, retries=0)) as c:
        yield c


def _fill(client, prompts=3, per_prompt=4):
    ids = client.put_prompts([Prompt("", f"{i}+{i}=", str(2 * i)) for i in range(prompts)])
    for pid in ids.prompt_ids:
        batch = [
            trajectory(pid, completion=[7, j], reward=j / per_prompt) for j in range(per_prompt)
        ]
        client.add_trajectories(batch, searcher_id="s1", request_id=new_request_id())
    return ids.prompt_ids


def test_put_lease_add_sample_round_trip(client):
    put = client.put_prompts([Prompt("", "1+1=", "2"), Prompt("q7", "2+2=", "4")])
    assert put.created == 2 and put.prompt_ids[1] == "q7"
    lease = client.lease_prompts("s1", 10)
    assert {p.id for p in lease.prompts} == set(put.prompt_ids)
    trajs = [trajectory(p.id, completion=[3, k], reward=k) for p in lease.prompts for k in range(3)]
    added = client.add_trajectories(
        trajs, searcher_id="s1", request_id=new_request_id(), lease_id=lease.lease_id
    )
    assert added.accepted == 6 and added.evicted == 0
    batch = client.sample(SampleSpec(num_prompts=2, samples_per_prompt=2, recency_probability=0.5))
    assert len(batch.groups) == 2
    assert {g.prompt.id for g in batch.groups} == set(put.prompt_ids)
    for group in batch.groups:
        assert len(group.trajectories) == 2
        assert group.source in (SampleSource.RECENCY, SampleSource.REWARD)
        assert all(t.prompt_id == group.prompt.id and t.id > 0 for t in group.trajectories)
        assert all(t.searcher_id == "s1" for t in group.trajectories)
    stats = client.stats()
    assert stats.trajectories == 6 and stats.prompts == 2
    assert stats.groups_sampled_total == 2
    assert [s.searcher_id for s in stats.searchers] == ["s1"]


def test_acknowledged_prompts_cycle_and_expired_leases_come_back(client):
    client.put_prompts([Prompt("a", "x"), Prompt("b", "y")])
    first = client.lease_prompts("s1", 1, lease_s=0.3)
    second = client.lease_prompts("s1", 1, lease_s=0.3)
    assert {first.prompts[0].id, second.prompts[0].id} == {"a", "b"}
    assert client.lease_prompts("s1", 2).prompts == []
    time.sleep(0.5)
    again = client.lease_prompts("s2", 2)
    assert {p.id for p in again.prompts} == {"a", "b"}


def test_add_is_idempotent_by_request_id(client):
    (pid,) = client.put_prompts([Prompt("", "x")]).prompt_ids
    request_id = uuid.uuid4().hex
    batch = [trajectory(pid, completion=[1, k]) for k in range(3)]
    first = client.add_trajectories(batch, searcher_id="s1", request_id=request_id)
    retry = client.add_trajectories(batch, searcher_id="s1", request_id=request_id)
    assert first.accepted == 3 and not first.replayed
    assert retry.replayed and retry.accepted == 3
    assert client.stats().trajectories == 3


def test_a_request_id_reused_for_another_batch_is_failed_precondition(client):
    (pid,) = client.put_prompts([Prompt("", "x")]).prompt_ids
    request_id = uuid.uuid4().hex
    client.add_trajectories(
        [trajectory(pid, completion=[1])], searcher_id="s1", request_id=request_id
    )
    other = [trajectory(pid, completion=[2])]
    with pytest.raises(FailedPreconditionError, match=request_id):
        client.add_trajectories(other, searcher_id="s1", request_id=request_id)
    stats = client.stats()
    assert stats.trajectories == 1 and stats.trajectories_added_total == 1


@pytest.mark.parametrize(
    "bad",
    [
        {"reward": math.nan},
        {"reward": math.inf},
        {"completion": []},
        {"prompt_id": "no-such-prompt"},
    ],
)
def test_bad_trajectories_are_refused_and_store_nothing(client, bad):
    (pid,) = client.put_prompts([Prompt("", "x")]).prompt_ids
    good = trajectory(pid, completion=[1, 2])
    bad_one = trajectory(
        bad.get("prompt_id", pid),
        completion=bad.get("completion", [3, 4]),
        reward=bad.get("reward", 0.0),
    )
    with pytest.raises(InvalidArgumentError):
        client.add_trajectories([good, bad_one], searcher_id="s1", request_id=new_request_id())
    assert client.stats().trajectories == 0


def test_token_logprobs_travel_both_ways(client):
    (pid,) = client.put_prompts([Prompt("", "x")]).prompt_ids
    sent = with_token_logprobs(trajectory(pid, completion=[1, 2]), [-0.5, -0.75], [-1.0, -0.125])
    client.add_trajectories([sent], searcher_id="s1", request_id=new_request_id())
    batch = client.sample(SampleSpec(num_prompts=1, samples_per_prompt=1, recency_probability=1))
    (got,) = batch.groups[0].trajectories
    assert got.behavior_token_logprobs == sent.behavior_token_logprobs
    assert got.ref_token_logprobs == sent.ref_token_logprobs


def test_sampling_temperatures_travel_both_ways_and_bad_ones_are_refused_by_name(client):
    (pid,) = client.put_prompts([Prompt("", "x")]).prompt_ids
    sent = trajectory(pid, completion=[1, 2])
    sent.sampling_temperature = 1.42
    client.add_trajectories([sent], searcher_id="s1", request_id=new_request_id())
    batch = client.sample(SampleSpec(num_prompts=1, samples_per_prompt=1, recency_probability=1))
    assert batch.groups[0].trajectories[0].sampling_temperature == 1.42
    sent.sampling_temperature = -1.0
    message = r"trajectories\[0\]\.sampling_temperature must be 0 \(the run's\)"
    with pytest.raises(InvalidArgumentError, match=message):
        client.add_trajectories([sent], searcher_id="s1", request_id=new_request_id())


def test_token_logprobs_that_miss_their_sum_are_refused_by_name(client):
    (pid,) = client.put_prompts([Prompt("", "x")]).prompt_ids
    good = with_token_logprobs(trajectory(pid, completion=[1, 2]), [-0.5, -0.75], [-1.0, -1.0])
    bad = with_token_logprobs(trajectory(pid, completion=[3, 4]), [-0.5, -0.75], [-1.0, -1.0])
    bad.ref_token_logprobs = pack_logprobs([-1.0, -3.0])
    message = r"trajectories\[1\]\.ref_token_logprobs add up to -4, not .*ref_logprob -2"
    with pytest.raises(InvalidArgumentError, match=message):
        client.add_trajectories([good, bad], searcher_id="s1", request_id=new_request_id())
    assert client.stats().trajectories == 0


@pytest.mark.parametrize(
    "spec",
    [
        SampleSpec(num_prompts=1, samples_per_prompt=0, recency_probability=0.5),
        SampleSpec(num_prompts=0, samples_per_prompt=1, recency_probability=0.5),
        SampleSpec(num_prompts=1, samples_per_prompt=1, recency_probability=1.5),
        SampleSpec(num_prompts=1, samples_per_prompt=1, recency_probability=-0.1),
        SampleSpec(num_prompts=1, samples_per_prompt=1, recency_probability=math.nan),
        SampleSpec(1, 1, 0.5, reward_temperature=-1.0),
        SampleSpec(1, 1, 0.5, min_groups=2, wait_s=1.0),
        SampleSpec(1, 1, 0.5, min_groups=1, wait_s=-1.0),
        SampleSpec(1, 1, 0.5, min_groups=1, wait_s=math.nan),
    ],
)
def test_bad_sample_requests_are_invalid_argument(client, spec):
    _fill(client, prompts=1)
    with pytest.raises(InvalidArgumentError):
        client.sample(spec)
    assert client.stats().groups_sampled_total == 0


def test_sample_with_fixed_seed_is_reproducible(client):
    _fill(client, prompts=5, per_prompt=6)
    spec = SampleSpec(3, 3, 0.5, reward_temperature=0.5, seed=42)
    first, second = client.sample(spec), client.sample(spec)
    ids = [[t.id for t in g.trajectories] for g in first.groups]
    assert ids == [[t.id for t in g.trajectories] for g in second.groups]


def test_max_age_excludes_stale_versions(client):
    (pid,) = client.put_prompts([Prompt("", "x")]).prompt_ids
    client.add_trajectories(
        [trajectory(pid, completion=[1, k], policy_version=1) for k in range(3)],
        searcher_id="s",
        request_id=new_request_id(),
    )
    client.add_trajectories(
        [trajectory(pid, completion=[2, k], policy_version=5) for k in range(2)],
        searcher_id="s",
        request_id=new_request_id(),
    )
    client.announce_weights(WeightVersion(5, "file:///w/5", SHA, 10, time.time()))
    batch = client.sample(SampleSpec(1, 5, 0.0, max_age_versions=1))
    assert [t.policy_version for t in batch.groups[0].trajectories] == [5, 5]
    assert batch.latest_version == 5


def test_a_long_poll_waits_past_the_call_deadline_and_answers_when_an_add_lands(buffer_address):
    settings = BufferClientSettings(address=buffer_address, retries=0, timeout_s=1.0)
    with BufferClient(settings) as waiting, BufferClient(settings) as searcher:
        (pid,) = searcher.put_prompts([Prompt("", "x")]).prompt_ids
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            poll = pool.submit(waiting.sample, SampleSpec(1, 2, 0.5, min_groups=1, wait_s=20.0))
            time.sleep(1.5)  # past the 1 s deadline a call has without its wait
            assert not poll.done()
            batch = [trajectory(pid, completion=[3, k]) for k in range(2)]
            searcher.add_trajectories(batch, searcher_id="s", request_id=new_request_id())
            answered = poll.result(timeout=10)
    assert len(answered.groups) == 1 and 1.4 < answered.waited_s < 10


def test_a_weights_long_poll_waits_past_the_call_deadline_and_answers_when_announced(
    buffer_address,
):
    settings = BufferClientSettings(address=buffer_address, retries=0, timeout_s=1.0)
    with BufferClient(settings) as searcher, BufferClient(settings) as trainer:
        trainer.announce_weights(WeightVersion(1, "file:///w/1", SHA, 2, time.time()))
        assert searcher.latest_weights(0, 20.0).version == 1  # newer than 0: at once
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            poll = pool.submit(searcher.latest_weights, 1, 20.0)
            time.sleep(1.5)  # past the 1 s deadline a call has without its wait
            assert not poll.done()
            trainer.announce_weights(WeightVersion(2, "file:///w/2", SHA, 4, time.time()))
            latest = poll.result(timeout=10)
        assert latest is not None and latest.version == 2
        for newer_than, wait_s in ((0, -1.0), (0, math.nan), (2**60, 1.0)):
            with pytest.raises(InvalidArgumentError, match=r"newer_than|wait_s"):
                searcher.latest_weights(newer_than, wait_s)


def test_weight_versions_only_increase(client):
    assert client.latest_weights() is None
    client.announce_weights(WeightVersion(1, "file:///w/1", SHA, 2, time.time()))
    client.announce_weights(WeightVersion(2, "file:///w/2", SHA, 4, time.time()))
    with pytest.raises(FailedPreconditionError):
        client.announce_weights(WeightVersion(2, "file:///w/2b", SHA, 4, time.time()))
    latest = client.latest_weights()
    assert latest is not None and latest.version == 2 and latest.uri == "file:///w/2"
    with pytest.raises(InvalidArgumentError):
        client.announce_weights(WeightVersion(3, "file:///w/3", "not-a-sha", 6, time.time()))


def test_over_size_message_is_resource_exhausted(tmp_path):
    service = start_buffer(tmp_path, "--set", "buffer.max_message_bytes=1048576")
    try:
        with BufferClient(BufferClientSettings(address=service.address, retries=0)) as client:
            (pid,) = client.put_prompts([Prompt("", "x")]).prompt_ids
            huge = trajectory(pid, completion=list(range(300_000)))
            with pytest.raises(ResourceExhaustedError):
                client.add_trajectories([huge], searcher_id="s1", request_id=new_request_id())
            assert client.stats().trajectories == 0
    finally:
        service.stop()


def test_health_and_reflection_are_served(buffer_address):
    with grpc.insecure_channel(buffer_address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "tba.v1.ReplayBuffer"):
            reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        reply = next(iter(stub.ServerReflectionInfo(iter([request]), timeout=5)))
        names = {s.name for s in reply.list_services_response.service}
        assert "tba.v1.ReplayBuffer" in names
