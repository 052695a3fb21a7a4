"""The run through the real buffer service (gRPC and REST), on the memory store and on
Redis: register, join, refusals naming the field, tagged adds, and the run surviving a
restart of a Redis-backed buffer."""

from __future__ import annotations

import dataclasses
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tba.buffer.config import BufferClientSettings
from tba.buffer.transport.grpc_client import BufferClient
from tba.domain import Prompt, new_request_id
from tba.errors import FailedPreconditionError
from tba.runs import Run, RunIdentity, RunRecipe
from tests.fixtures.buffer_service import BufferProcess, start_buffer
from tests.fixtures.data import trajectory

IDENTITY = RunIdentity("tiny", "sha256:" + "0" * 64, "a" * 64, "arithmetic", "b" * 64, 1.0, 5)
RUN = Run("run-1", IDENTITY, RunRecipe('{"name":"arithmetic"}', '{"source":"tiny"}', 0))


@pytest.fixture(params=["memory", "redis"])
def service(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BufferProcess]:
    args = []
    if request.param == "redis":
        args = ["--store", request.getfixturevalue("redis_server").url]
    process = start_buffer(tmp_path, *args)
    yield process
    process.stop()


def client_of(service: BufferProcess) -> BufferClient:
    return BufferClient(BufferClientSettings(address=service.address, retries=20))


def test_a_run_is_registered_once_and_joined(service):
    with client_of(service) as client:
        assert client.join_run("s1", RunIdentity()) is None
        registered = client.register_run(RUN)
        assert (registered.run_id, registered.identity, registered.recipe) == (
            RUN.run_id,
            IDENTITY,
            RUN.recipe,
        )
        assert registered.registered_at_s > 0
        assert client.register_run(RUN) == registered  # a resume: same id and identity
        assert client.join_run("s1", RunIdentity(task_name="arithmetic")) == registered
        assert client.join_run("s1", IDENTITY) == registered
        assert client.stats().run == registered
        stats = httpx.get(f"{service.http_url}/v1/stats", timeout=10).json()
        assert stats["run"]["run_id"] == "run-1"
        assert stats["run"]["identity"]["task_name"] == "arithmetic"
        assert stats["run"]["task"] == {"name": "arithmetic"}
        metrics = httpx.get(f"{service.http_url}/metrics", timeout=10).text
        assert 'tba_buffer_run_info{model_revision="sha256:' in metrics
        assert 'run_id="run-1",task="arithmetic"} 1.0' in metrics


def test_contradicting_runs_and_searchers_are_refused_naming_the_field(service):
    with client_of(service) as client:
        client.register_run(RUN)
        with pytest.raises(FailedPreconditionError, match=r"searcher s1 .*temperature: the run"):
            client.join_run("s1", RunIdentity(temperature=0.7))
        other = dataclasses.replace(IDENTITY, task_name="gsm8k")
        with pytest.raises(FailedPreconditionError, match=r"run run-2 is another run .*task_name"):
            client.register_run(Run("run-2", other))
        with pytest.raises(FailedPreconditionError, match=r"resuming run run-1 .*tokenizer"):
            resumed = dataclasses.replace(IDENTITY, tokenizer_sha256="c" * 64)
            client.register_run(Run("run-1", resumed))
        assert client.stats().run is not None and client.stats().run.identity == IDENTITY
    log = service.log_path.read_text()
    assert "run run-1 registered: RunIdentity(model_source='tiny'" in log
    assert "refused a searcher: searcher s1 contradicts the buffer's run run-1" in log
    assert "refused a trainer's run: the buffer holds run run-1" in log


def test_a_runs_temperature_range_is_kept_and_a_differing_one_refused_by_name(service):
    ranged = dataclasses.replace(
        IDENTITY, temperature_low=0.7, temperature_high=2.0, temperature_draw_fraction=0.5
    )
    with client_of(service) as client:
        assert client.register_run(Run("run-1", ranged, RUN.recipe)).identity == ranged
        assert client.join_run("s1", IDENTITY).identity == ranged  # no range: it takes the run's
        other = dataclasses.replace(ranged, temperature_low=0.5)
        with pytest.raises(FailedPreconditionError, match=r"temperature_low: the run has 0\.7"):
            client.join_run("s1", other)
        stats = httpx.get(f"{service.http_url}/v1/stats", timeout=10).json()
        assert stats["run"]["identity"]["temperature_high"] == 2.0


def test_trajectories_are_tagged_with_the_registered_run(service):
    with client_of(service) as client:
        (pid,) = client.put_prompts([Prompt("", "1+1=", "2")]).prompt_ids
        assert (
            client.add_trajectories(
                [trajectory(pid, (1,))], searcher_id="old-client", request_id=new_request_id()
            ).accepted
            == 1
        )
        client.register_run(RUN)
        with pytest.raises(FailedPreconditionError, match="untagged batch"):
            client.add_trajectories(
                [trajectory(pid, (2,))], searcher_id="old-client", request_id=new_request_id()
            )
        with pytest.raises(FailedPreconditionError, match="run run-2, but the buffer serves"):
            client.add_trajectories(
                [trajectory(pid, (3,))],
                searcher_id="s1",
                request_id=new_request_id(),
                run_id="run-2",
            )
        tagged = client.add_trajectories(
            [trajectory(pid, (4,))], searcher_id="s1", request_id=new_request_id(), run_id="run-1"
        )
        assert tagged.accepted == 1
        assert client.stats().trajectories_added_total == 2


def test_the_run_survives_a_restart_of_a_redis_backed_buffer(redis_server, tmp_path):
    service = start_buffer(tmp_path, "--store", redis_server.url)
    try:
        with client_of(service) as client:
            registered = client.register_run(RUN)
        service.restart(signal.SIGKILL)
        with client_of(service) as client:
            assert client.stats().run == registered
            assert client.register_run(RUN) == registered
    finally:
        service.stop()
