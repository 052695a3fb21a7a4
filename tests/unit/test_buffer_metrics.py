"""The gRPC handling-time histogram on the buffer's /metrics: cumulative buckets by method,
as Prometheus reads them."""

from __future__ import annotations

import asyncio

from prometheus_client.parser import text_string_to_metric_families

from tba.buffer.config import BufferSettings
from tba.buffer.memory_store import MemoryStore
from tba.buffer.metrics import HandlingTimes, render
from tba.buffer.server import store_limits
from tba.buffer.service import BufferService
from tba.domain import BufferStats


def _stats() -> BufferStats:
    settings = BufferSettings()
    return asyncio.run(BufferService(MemoryStore(store_limits(settings)), settings).stats())


def _histogram(text: str) -> dict[tuple[str, str], float]:
    (family,) = [
        f
        for f in text_string_to_metric_families(text)
        if f.name == "tba_buffer_rpc_handling_seconds"
    ]
    return {
        (s.name.rsplit("_", 1)[-1], s.labels["method"] + s.labels.get("le", "")): s.value
        for s in family.samples
    }


def test_each_methods_calls_fall_in_cumulative_buckets_with_their_sum():
    handling = HandlingTimes()
    for seconds in (0.0004, 0.003, 0.0025, 20.0):
        handling.observe("Sample", seconds)
    handling.observe("AddTrajectories", 0.01)
    got = _histogram(render(_stats(), handling).decode())
    assert got[("bucket", "Sample0.0005")] == 1
    assert got[("bucket", "Sample0.001")] == 1
    # A bucket holds the calls at or under its bound.
    assert got[("bucket", "Sample0.0025")] == 2
    assert got[("bucket", "Sample10.0")] == 3
    assert got[("bucket", "Sample+Inf")] == got[("count", "Sample")] == 4
    assert abs(got[("sum", "Sample")] - 20.0059) < 1e-9
    assert got[("bucket", "AddTrajectories0.01")] == 1
    assert got[("bucket", "AddTrajectories0.005")] == 0


def test_without_handling_times_the_page_has_no_histogram():
    text = render(_stats()).decode()
    assert "tba_buffer_rpc_handling_seconds" not in text
    assert "tba_buffer_trajectories 0.0" in text
