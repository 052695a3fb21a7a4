"""Sustained load on the Redis-backed buffer service with the token on: 16 simulated searchers
(threads with the real BufferClient: lease 4 prompts, add 4 completions of 64 tokens each per
prompt) and a trainer sampling 8 x 4 batches, for 60 s (5 s with --quick). Reports throughput
and p50 / p99 latency per call.

Target: no error in the whole run.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from bench.common import Row
from tests.fixtures.buffer_service import BufferProcess
from tests.fixtures.load import LoadReport, run_load
from tests.fixtures.redis_server import start_redis

NAME = "load"
SEARCHERS = 16
TOKEN = "bench-token-0123456789abcdef"


def run(quick: bool = False) -> list[Row]:
    duration_s = 5.0 if quick else 60.0
    with tempfile.TemporaryDirectory() as tmp:
        server = start_redis(Path(tmp) / "redis")
        env = {"TBA_BUFFER__AUTH_TOKEN": TOKEN}
        service = BufferProcess(["--store", server.url], Path(tmp) / "buffer.log", env=env)
        try:
            service.start()
            report = run_load(service.address, SEARCHERS, duration_s=duration_s, token=TOKEN)
        finally:
            service.stop()
            server.kill()
    print(report.summary(), flush=True)
    return _rows(report)


def _rows(report: LoadReport) -> list[Row]:
    seconds = report.duration_s
    rows = [
        Row(NAME, f"{SEARCHERS} searchers + trainer, run", seconds, "s"),
        Row(NAME, "trajectories acknowledged", report.trajectories_acknowledged / seconds, "1/s"),
        Row(NAME, "groups sampled", report.groups_sampled / seconds, "1/s"),
    ]
    for call in sorted(report.latencies_ms):
        calls = len(report.latencies_ms[call])
        rows += [
            Row(NAME, f"{call} calls", calls / seconds, "1/s"),
            Row(NAME, f"{call} p50", report.percentile_ms(call, 50), "ms"),
            Row(NAME, f"{call} p99", report.percentile_ms(call, 99), "ms"),
        ]
    errors = len(report.errors)
    rows.append(Row(NAME, "errors", errors, "", target="== 0", passed=errors == 0))
    return rows
