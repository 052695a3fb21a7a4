"""Faults on real processes: kill -9 of the buffer service or of redis-server (AOF, fsync
always) while a client adds and another samples, and a searcher killed while it holds leases.
Every acknowledged prompt and trajectory is found afterwards, the clients ride the outage out
by themselves (retries with backoff), and leased prompts come back once their lease expires.
While Redis is down the buffer's readiness says so and its liveness does not."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tba.buffer.config import BufferClientSettings
from tba.buffer.transport.grpc_client import BufferClient
from tba.buffer.transport.grpc_server import LIVENESS, READINESS
from tba.domain import Prompt, SampleSpec, Trajectory, new_request_id, unpack_tokens
from tests.fixtures.buffer_service import start_buffer
from tests.fixtures.data import trajectory
from tests.fixtures.deploy_settings import run_tool
from tests.fixtures.redis_server import RedisServer

BATCHES = 60  # one new prompt and its trajectories per batch
PER_BATCH = 4
FAULT_AFTER = 20  # acknowledged batches before the fault
WAIT_S = 120.0  # only a guard against a hang; the tests wait on events


def patient_client(address: str) -> BufferClient:
    return BufferClient(BufferClientSettings(address=address, retries=40, retry_backoff_s=0.05))


class RetryCounter(logging.Handler):
    """Counts the client's retries (its warnings), and wakes whoever waits for the next."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0
        self.changed = threading.Condition()

    def emit(self, record: logging.LogRecord) -> None:
        if "retry" in record.getMessage():
            with self.changed:
                self.count += 1
                self.changed.notify_all()

    def wait_beyond(self, count: int) -> bool:
        with self.changed:
            return self.changed.wait_for(lambda: self.count > count, timeout=WAIT_S)


@pytest.fixture
def retries() -> Iterator[RetryCounter]:
    counter = RetryCounter()
    logger = logging.getLogger("tba.buffer.transport.grpc_client")
    logger.addHandler(counter)
    yield counter
    logger.removeHandler(counter)


class Writer(threading.Thread):
    """Puts one prompt and adds its trajectories per batch; records what was acknowledged."""

    def __init__(self, address: str) -> None:
        super().__init__(daemon=True)
        self.address = address
        self.prompts: list[str] = []
        self.trajectories: set[tuple[str, tuple[int, ...]]] = set()
        self.reached_fault_point = threading.Event()
        self.fault_injected = threading.Event()  # so that its next call meets the fault
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with patient_client(self.address) as client:
                for n in range(BATCHES):
                    self._batch(client, n)
                    if n + 1 == FAULT_AFTER:
                        self.reached_fault_point.set()
                        self.fault_injected.wait(WAIT_S)
        except BaseException as exc:  # reported by the test
            self.error = exc
            self.reached_fault_point.set()

    def _batch(self, client: BufferClient, n: int) -> None:
        prompt_id = f"q{n}"  # an explicit id: a retried put cannot add a second prompt
        client.put_prompts([Prompt(prompt_id, f"{n}+1=", str(n + 1))])
        self.prompts.append(prompt_id)
        batch = [trajectory(prompt_id, (n, k), reward=k / PER_BATCH) for k in range(PER_BATCH)]
        result = client.add_trajectories(batch, searcher_id="writer", request_id=new_request_id())
        assert result.accepted == PER_BATCH, result
        self.trajectories.update(_key(t) for t in batch)


class Sampler(threading.Thread):
    def __init__(self, address: str, writer: Writer) -> None:
        super().__init__(daemon=True)
        self.address = address
        self.writer = writer
        self.samples = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with patient_client(self.address) as client:
                while self.writer.is_alive():
                    client.sample(SampleSpec(2, 2, 0.5))
                    self.samples += 1
        except BaseException as exc:
            self.error = exc


def _key(t: Trajectory) -> tuple[str, tuple[int, ...]]:
    return t.prompt_id, tuple(unpack_tokens(t.completion_token_ids))


def _everything(client: BufferClient) -> set[tuple[str, tuple[int, ...]]]:
    """Every stored trajectory: recency over a window that holds every prompt, K = all."""
    batch = client.sample(SampleSpec(BATCHES, PER_BATCH, recency_probability=1.0))
    return {_key(t) for group in batch.groups for t in group.trajectories}


def _check_nothing_lost(address: str, writer_prompts: int, acknowledged: set) -> None:
    with patient_client(address) as client:
        stats = client.stats()
        assert stats.prompts == writer_prompts == BATCHES
        assert stats.trajectories == len(acknowledged) == BATCHES * PER_BATCH
        assert _everything(client) == acknowledged


@pytest.mark.parametrize("victim", ["buffer", "redis"])
def test_kill_9_loses_nothing_acknowledged(redis_server: RedisServer, tmp_path, retries, victim):
    service = start_buffer(
        tmp_path, "--store", redis_server.url, "--set", f"buffer.recency_window={BATCHES}"
    )
    pid = service.proc.pid if service.proc else 0
    try:
        if victim == "buffer":
            crash = lambda: service.stop(signal.SIGKILL)  # noqa: E731
            recover = lambda: service.start(service.grpc_port)  # noqa: E731
        else:
            crash, recover = redis_server.kill, redis_server.start
        writer = Writer(service.address)
        figures = _run_through_fault(writer, service.address, retries, crash, recover)
        if victim == "redis":  # the same process reconnected by itself
            assert service.proc is not None and service.proc.pid == pid
            assert service.proc.poll() is None
        _check_nothing_lost(service.address, len(writer.prompts), writer.trajectories)
        print(
            f"\nkill -9 {victim}: {BATCHES} prompts and {BATCHES * PER_BATCH} trajectories "
            f"sent and acknowledged, all found; {figures['retries']} client retries, "
            f"{figures['samples']} samples during the run"
        )
    finally:
        service.stop()


def _run_through_fault(
    writer: Writer, address: str, retries: RetryCounter, crash, recover
) -> dict[str, int]:
    sampler = Sampler(address, writer)
    writer.start()
    sampler.start()
    assert writer.reached_fault_point.wait(WAIT_S) and writer.error is None, writer.error
    seen = retries.count
    crash()
    writer.fault_injected.set()
    assert retries.wait_beyond(seen), "no client call met the outage"
    recover()
    writer.join(WAIT_S)
    sampler.join(WAIT_S)
    assert not writer.is_alive() and not sampler.is_alive()
    assert writer.error is None, writer.error
    assert sampler.error is None, sampler.error
    return {"retries": retries.count, "samples": sampler.samples}


HEALTHCHECK = Path(__file__).resolve().parents[2] / "services/buffer/healthcheck.py"
CHECK_INTERVAL_S = 0.2


def _health(address: str) -> tuple[str, str]:
    """The gRPC health (readiness, liveness) of the buffer at `address`, as status names."""
    names = health_pb2.HealthCheckResponse.ServingStatus.Name
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        readiness, liveness = (
            names(stub.Check(health_pb2.HealthCheckRequest(service=s), timeout=5).status)
            for s in (READINESS, LIVENESS)
        )
    return readiness, liveness


def _seconds_until_ready_is(address: str, status: str) -> float:
    begin = time.monotonic()
    while _health(address)[0] != status:
        assert time.monotonic() - begin < WAIT_S, f"readiness never became {status}"
        time.sleep(0.05)
    return time.monotonic() - begin


def test_readiness_follows_the_store_and_liveness_stays(redis_server: RedisServer, tmp_path):
    """While Redis is down: gRPC readiness NOT_SERVING (the container check fails with it,
    /healthz 503), liveness SERVING (/livez 200); both SERVING once Redis is back."""
    interval = f"buffer.store_check_interval_s={CHECK_INTERVAL_S}"
    service = start_buffer(tmp_path, "--store", redis_server.url, "--set", interval)
    container_check = [sys.executable, str(HEALTHCHECK), service.address]
    try:
        assert _health(service.address) == ("SERVING", "SERVING")
        assert run_tool(container_check).returncode == 0
        redis_server.kill()
        down_s = _seconds_until_ready_is(service.address, "NOT_SERVING")
        assert _health(service.address)[1] == "SERVING"
        assert httpx.get(f"{service.http_url}/healthz", timeout=10).status_code == 503
        assert httpx.get(f"{service.http_url}/livez", timeout=10).status_code == 200
        check = run_tool(container_check)
        assert check.returncode == 1 and "NOT_SERVING" in check.stderr
        redis_server.start()
        up_s = _seconds_until_ready_is(service.address, "SERVING")
        assert run_tool(container_check).returncode == 0
        assert httpx.get(f"{service.http_url}/healthz", timeout=10).status_code == 200
        print(
            f"\nstore outage: readiness NOT_SERVING {down_s:.2f} s after kill -9 of Redis, "
            f"SERVING {up_s:.2f} s after its restart (checks every {CHECK_INTERVAL_S} s); "
            "liveness SERVING throughout"
        )
    finally:
        service.stop()
    assert "readiness NOT_SERVING" in service.log_path.read_text()


DEAD_SEARCHER = textwrap.dedent(
    """
    import json, sys
    from tba.buffer.config import BufferClientSettings
    from tba.buffer.transport.grpc_client import BufferClient

    client = BufferClient(BufferClientSettings(address=sys.argv[1]))
    lease = client.lease_prompts("doomed", int(sys.argv[2]), lease_s=float(sys.argv[3]))
    print(json.dumps([p.id for p in lease.prompts]), flush=True)
    sys.stdin.read()  # holds its lease until killed
    """
)
PROMPTS = 24
DOOMED_LEASE = 12
LEASE_S = 1.0


def test_prompts_of_a_killed_searcher_come_back_after_their_lease(redis_server, tmp_path):
    service = start_buffer(tmp_path, "--store", redis_server.url)
    try:
        with patient_client(service.address) as client:
            client.put_prompts([Prompt(f"q{i}", f"{i}+1=") for i in range(PROMPTS)])
            doomed = _lease_and_die(service.address)
            assert len(doomed) == DOOMED_LEASE
            served = _serve_until_every_prompt_has_a_trajectory(client)
            stats = client.stats()
        assert set(doomed) <= served.keys()
        assert stats.prompts_with_trajectories == PROMPTS
        assert stats.leases_in_flight == 0
        print(
            f"\nkilled searcher: held {len(doomed)} of {PROMPTS} prompts; all {PROMPTS} "
            f"served by the survivor, the last in its call {max(served.values()) + 1} to lease"
        )
    finally:
        service.stop()


def _lease_and_die(address: str) -> list[str]:
    """A searcher process that leases prompts and is killed -9 while it holds them."""
    args = [sys.executable, "-c", DEAD_SEARCHER, address, str(DOOMED_LEASE), str(LEASE_S)]
    proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        doomed: list[str] = json.loads(proc.stdout.readline())
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    return doomed


def _serve_until_every_prompt_has_a_trajectory(client: BufferClient) -> dict[str, int]:
    """A surviving searcher: leases, acknowledges with trajectories; stops once every prompt
    has one. Returns the round in which each prompt was first served."""
    served: dict[str, int] = {}
    empty = threading.Event()
    for round_no in range(10_000):
        lease = client.lease_prompts("survivor", 4)
        if not lease.prompts:
            empty.wait(0.05)  # the dead searcher's lease has not expired yet
            continue
        batch = [trajectory(p.id, (round_no, i)) for i, p in enumerate(lease.prompts)]
        client.add_trajectories(
            batch, searcher_id="survivor", request_id=new_request_id(), lease_id=lease.lease_id
        )
        for p in lease.prompts:
            served.setdefault(p.id, round_no)
        if len(served) == PROMPTS:
            return served
    raise AssertionError(f"only {len(served)} of {PROMPTS} prompts came back")
