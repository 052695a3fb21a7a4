"""What each Redis `appendfsync` policy costs and keeps: the load of bench_load (16 searchers
and a trainer, token on) for 20 s (4 s with --quick) per policy, with redis-server killed -9
halfway and started again from its AOF. Reports acknowledged trajectories per second and how
many acknowledged trajectories the restarted Redis lacks (the counter of added trajectories
is written by the same script as the trajectories, so it is what survived).

Target: with `always`, none lost. A kill -9 of the process leaves the kernel's page cache, so
`everysec` and `no` normally lose nothing here either; they differ on an OS crash or power
loss (up to about 1 s, and up to the kernel's writeback delay, about 30 s), which no test on
one machine can cause.
"""

from __future__ import annotations

import tempfile
import threading
from pathlib import Path

from pydantic import SecretStr

from bench.common import Row
from tba.buffer.config import BufferClientSettings
from tba.buffer.transport.grpc_client import BufferClient
from tests.fixtures.buffer_service import BufferProcess
from tests.fixtures.load import LoadReport, run_load
from tests.fixtures.redis_server import RedisServer, start_redis

NAME = "durability"
POLICIES = ("always", "everysec", "no")
SEARCHERS = 16
TOKEN = "bench-token-0123456789abcdef"


def run(quick: bool = False) -> list[Row]:
    duration_s = 4.0 if quick else 20.0
    rows: list[Row] = []
    for policy in POLICIES:
        with tempfile.TemporaryDirectory() as tmp:
            server = start_redis(Path(tmp) / "redis", appendfsync=policy)
            env = {"TBA_BUFFER__AUTH_TOKEN": TOKEN}
            service = BufferProcess(["--store", server.url], Path(tmp) / "buffer.log", env=env)
            try:
                service.start()
                report, found = _load_through_a_redis_crash(service, server, duration_s)
            finally:
                service.stop()
                server.kill()
        rows += _rows(policy, report, found)
    return rows


def _load_through_a_redis_crash(
    service: BufferProcess, server: RedisServer, duration_s: float
) -> tuple[LoadReport, int]:
    reports: list[LoadReport] = []
    load = threading.Thread(
        target=lambda: reports.append(
            run_load(service.address, SEARCHERS, duration_s=duration_s, token=TOKEN)
        )
    )
    load.start()
    threading.Event().wait(duration_s / 2)
    server.kill()
    server.start()
    load.join()
    settings = BufferClientSettings(address=service.address, auth_token=SecretStr(TOKEN))
    with BufferClient(settings) as client:
        found = client.stats().trajectories_added_total
    print(f"appendfsync {server.appendfsync}: {reports[0].summary()}", flush=True)
    return reports[0], found


def _rows(policy: str, report: LoadReport, found: int) -> list[Row]:
    acknowledged = report.trajectories_acknowledged
    lost = acknowledged - found
    return [
        Row(NAME, f"{policy}: acknowledged", acknowledged / report.duration_s, "traj/s"),
        Row(NAME, f"{policy}: acknowledged in all", acknowledged, "traj"),
        Row(NAME, f"{policy}: errors", len(report.errors), ""),
        Row(
            NAME,
            f"{policy}: lost after kill -9",
            lost,
            "traj",
            target="== 0" if policy == "always" else "",
            passed=lost == 0 and not report.errors if policy == "always" else None,
        ),
    ]
