"""Load: 16 simulated searchers with the real BufferClient and a sampling trainer against the
Redis-backed service, with the token on. A short run by round counts (a few seconds here);
bench/bench_load.py runs the same for 60 s and reports its figures."""

from __future__ import annotations

from pydantic import SecretStr

from tba.buffer.config import BufferClientSettings
from tba.buffer.transport.grpc_client import BufferClient
from tests.fixtures.buffer_service import BufferProcess
from tests.fixtures.load import LEASE_PROMPTS, PROMPTS, SAMPLES_PER_PROMPT, run_load

SEARCHERS = 16
ROUNDS = 60
TOKEN = "tba-test-token-0123456789abcdef"


def test_sixteen_searchers_and_a_trainer_without_an_error(shared_redis, unique_prefix, tmp_path):
    args = ["--store", shared_redis.url, "--set", f"buffer.key_prefix={unique_prefix}"]
    service = BufferProcess(args, tmp_path / "buffer.log", env={"TBA_BUFFER__AUTH_TOKEN": TOKEN})
    service.start()
    try:
        report = run_load(service.address, SEARCHERS, rounds=ROUNDS, token=TOKEN)
        settings = BufferClientSettings(address=service.address, auth_token=SecretStr(TOKEN))
        with BufferClient(settings) as client:
            stats = client.stats()
    finally:
        service.stop()
    print("\n" + report.summary())
    assert report.errors == []
    assert report.rounds_done == [ROUNDS] * SEARCHERS
    most = SEARCHERS * ROUNDS * LEASE_PROMPTS * SAMPLES_PER_PROMPT
    assert SEARCHERS * ROUNDS * SAMPLES_PER_PROMPT <= report.trajectories_acknowledged <= most
    assert stats.trajectories_added_total == report.trajectories_acknowledged
    assert stats.trajectories + stats.evicted_total == report.trajectories_acknowledged
    assert stats.prompts == PROMPTS and stats.leases_in_flight == 0
    assert report.groups_sampled > 0
    assert {s.searcher_id for s in stats.searchers} == {f"s{i}" for i in range(SEARCHERS)}
