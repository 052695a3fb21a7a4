"""Buffer service throughput and latency at 10^4, 10^5 and 10^6 stored trajectories
(256-token completions), beside a raw redis-py pipelined write of the same blobs on the same
Redis in the same run; and the REST latency a dashboard or script sees on a kept-alive
connection (embedded store).

Targets: Sample p50 latency at the largest size within 2x of that at the smallest; ingest
through the service (gRPC + validation + Lua) at least 30% of the raw pipelined write rate;
REST GET /v1/stats p50 under 5 ms (Nagle and delayed ACK added 40 ms to each request once).
"""

from __future__ import annotations

import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path

import httpx
import numpy as np
import redis

from bench.common import Row
from tba.buffer import codec
from tba.buffer.config import BufferClientSettings
from tba.buffer.transport.grpc_client import BufferClient
from tba.domain import Prompt, SampleSpec, Trajectory, new_request_id
from tests.fixtures.buffer_service import BufferProcess
from tests.fixtures.data import trajectory
from tests.fixtures.redis_server import start_redis

NAME = "buffer"
COMPLETION_TOKENS = 256
BATCH = 256
PER_PROMPT = 50
INGEST_THREADS = 2
SAMPLE_CALLS = 200
SPEC = SampleSpec(num_prompts=8, samples_per_prompt=20, recency_probability=0.5)
REST_CALLS = 200
REST_TARGET_MS = 5.0


def _trajectories(prompt_ids: list[str], start: int, count: int) -> list[Trajectory]:
    """`count` distinct 256-token completions spread over the prompts, PER_PROMPT each."""
    out = []
    for n in range(start, start + count):
        tokens = np.arange(COMPLETION_TOKENS, dtype=np.uint32) + n
        t = trajectory(prompt_ids[n // PER_PROMPT], reward=float(n % 2))
        t.completion_token_ids = tokens.tobytes()
        t.completion_text = "x" * COMPLETION_TOKENS
        out.append(t)
    return out


def raw_write_rate(url: str, count: int) -> float:
    """Trajectories/s of redis-py pipelined HSETs of the same encoded blobs."""
    client = redis.Redis.from_url(url)
    blobs = [codec.encode_trajectory(t) for t in _trajectories(["p"] * count, 0, count)]
    key = f"rawbench:{uuid.uuid4().hex}"
    start = time.perf_counter()
    for offset in range(0, count, BATCH):
        pipe = client.pipeline(transaction=False)
        for i, blob in enumerate(blobs[offset : offset + BATCH], start=offset):
            pipe.hset(key, str(i), blob)
        pipe.execute()
    elapsed = time.perf_counter() - start
    client.delete(key)
    client.close()
    return count / elapsed


def ingest(address: str, prompt_ids: list[str], start: int, stop: int) -> float:
    """Adds trajectories [start, stop) through the service from several clients; returns /s."""
    batches = [(o, min(BATCH, stop - o)) for o in range(start, stop, BATCH)]
    shards = [batches[i::INGEST_THREADS] for i in range(INGEST_THREADS)]

    def work(shard: list[tuple[int, int]]) -> None:
        with BufferClient(BufferClientSettings(address=address)) as client:
            for offset, size in shard:
                client.add_trajectories(
                    _trajectories(prompt_ids, offset, size),
                    searcher_id="bench",
                    request_id=new_request_id(),
                )

    threads = [threading.Thread(target=work, args=(s,)) for s in shards]
    begin = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return (stop - start) / (time.perf_counter() - begin)


def sample_latencies_ms(client: BufferClient) -> list[float]:
    latencies = []
    for _ in range(SAMPLE_CALLS):
        begin = time.perf_counter()
        batch = client.sample(SPEC)
        latencies.append((time.perf_counter() - begin) * 1000)
        assert len(batch.groups) == SPEC.num_prompts
    return latencies


def rest_stats_p50_ms(http_url: str) -> float:
    """p50 of REST_CALLS sequential GET /v1/stats on one kept-alive connection."""
    latencies = []
    with httpx.Client(base_url=http_url, timeout=10) as http:
        for _ in range(REST_CALLS):
            begin = time.perf_counter()
            http.get("/v1/stats").raise_for_status()
            latencies.append((time.perf_counter() - begin) * 1000)
    return statistics.median(latencies)


def rest_row(tmp: Path) -> Row:
    service = BufferProcess([], tmp / "rest.log")  # the embedded store
    try:
        service.start()
        p50 = rest_stats_p50_ms(service.http_url)
    finally:
        service.stop()
    return Row(
        NAME,
        f"REST GET /v1/stats p50 ({REST_CALLS}, kept-alive, embedded store)",
        p50,
        "ms",
        target=f"< {REST_TARGET_MS:g} ms",
        passed=p50 < REST_TARGET_MS,
    )


def run(quick: bool = False) -> list[Row]:
    sizes = (2_000, 20_000) if quick else (10_000, 100_000, 1_000_000)
    with tempfile.TemporaryDirectory() as tmp:
        rest = rest_row(Path(tmp))
        server = start_redis(Path(tmp) / "redis")
        service = BufferProcess(
            ["--store", server.url, "--set", f"buffer.capacity={sizes[-1]}"],
            Path(tmp) / "buffer.log",
        )
        try:
            raw = raw_write_rate(server.url, min(50_000, sizes[-1]))
            service.start()
            return [rest, *_measure(service.address, sizes, raw)]
        finally:
            service.stop()
            server.kill()


def _measure(address: str, sizes: tuple[int, ...], raw_rate: float) -> list[Row]:
    rows = [Row(NAME, "raw redis-py pipelined HSET", raw_rate, "traj/s")]
    with BufferClient(BufferClientSettings(address=address, timeout_s=120)) as client:
        prompts = [Prompt(f"b{i}", f"prompt {i}") for i in range(sizes[-1] // PER_PROMPT)]
        for offset in range(0, len(prompts), 10_000):
            client.put_prompts(prompts[offset : offset + 10_000])
        prompt_ids = [p.id for p in prompts]
        stored, p50s, rates = 0, [], []
        for size in sizes:
            rates.append(ingest(address, prompt_ids, stored, size) * 1.0)
            stored = size
            latencies = sample_latencies_ms(client)
            p50 = statistics.median(latencies)
            p99 = float(np.percentile(latencies, 99))
            p50s.append(p50)
            rows += [
                Row(
                    NAME,
                    f"ingest via gRPC to {size:.0e}",
                    rates[-1],
                    "traj/s",
                    raw_rate,
                    rates[-1] / raw_rate,
                    ">= 0.30 of raw",
                    rates[-1] / raw_rate >= 0.3,
                ),
                Row(NAME, f"Sample p50 at {size:.0e}", p50, "ms"),
                Row(NAME, f"Sample p99 at {size:.0e}", p99, "ms"),
                Row(NAME, f"Sample groups/s at {size:.0e}", SPEC.num_prompts * 1000 / p50, "1/s"),
            ]
        growth = p50s[-1] / p50s[0]
        rows.append(
            Row(
                NAME,
                f"Sample p50 {sizes[-1]:.0e} / {sizes[0]:.0e}",
                growth,
                "x",
                p50s[0],
                growth,
                "<= 2",
                growth <= 2,
            )
        )
    return rows
