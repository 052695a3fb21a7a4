"""Scale beyond this machine, simulated: the real buffer service on a real Redis and the real
trainer loop (`tba.trainer.main.build_loop`, the demo's settings from
configs/arithmetic-demo.toml: tiny model, B 16 x K 8, completions at most one version old,
publishing every step) against N simulated searchers (`bench.simulated_searchers`: threads
in up to 4 processes, each leasing 16 prompts, sleeping 0.5 s of generation, posting 8
demo-sized completions per prompt over gRPC) for N = 1, 4, 16, 64, 200 trainer steps each
(--quick: 1 and 16, 10 steps; `python -m bench.bench_scale --counts 1,64 --steps 100` runs a
part). A fresh Redis, buffer and run per N.

Per N: the trainer's wait for data per step (the first step, which waits for the searchers
to start, left out), the ingest rate the searchers were acknowledged (beside the nominal
N x 128 trajectories per 0.5 s), ingest errors, the trainer's Sample p50 / p99 (every call,
polls included, each less the time it waited in the buffer for data: the trainer long-polls)
and the same calls as the service timed its handling of them (its waits left out too)
(`tba_buffer_rpc_handling_seconds` on its /metrics, quantiles interpolated within buckets as
Prometheus does), the staleness (versions behind the buffer's newest) of the trajectories in
the batches it trained on, the trainer's step time, and the cores the buffer service, Redis,
the trainer's process and the searchers' processes kept busy while the trainer ran (from
/proc and process_time: where the CPU went when the machine runs short), and the CPU pressure:
the share of that time in which some runnable task waited for a core (/proc/pressure/cpu,
the whole machine's: a tail that grows with it is queueing for cores, not in the service).

Targets: the trainer's wait falls as N grows; no ingest error at the largest N; Sample p99 at
the largest N within 3x of that at N = 1.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from bench.common import Row, cpu_waited_s, proc_stat
from bench.simulated_searchers import (
    PROMPTS_PER_ROUND,
    ROUND_LATENCY_S,
    SAMPLES_PER_PROMPT,
    SearcherPool,
    SearcherReport,
    Tokens,
)
from tba.buffer.config import BufferClientSettings
from tba.buffer.transport.grpc_client import BufferClient
from tba.cli import run_sections
from tba.domain import Batch, SampleSpec, pack_tokens
from tba.settings import load_settings
from tba.tasks.arithmetic import ArithmeticTask
from tba.tasks.base import Split
from tba.trainer.config import TrainerRunSettings
from tests.fixtures.buffer_service import BufferProcess
from tests.fixtures.redis_server import start_redis

NAME = "scale"
DEMO = Path(__file__).resolve().parents[1] / "configs" / "arithmetic-demo.toml"
PROMPTS = 2048  # twice what 64 searchers lease at once
SAMPLE_P99_RATIO = 3.0
COUNTS = (1, 4, 16, 64)
# Trainer steps per N, a Sample call each: a p99 of 40 calls was their slowest one.
STEPS = 200
QUICK_STEPS = 10
PHASES = ("wait_data", "compute", "publish", "checkpoint")  # a step's timed phases


@dataclass
class TimedSource:
    """The trainer's BufferClient, each Sample call timed less its wait in the buffer for
    data (a long poll: what is left is the call's own work and queueing), and the staleness
    of every trajectory in the batches the loop accepts (the first with `min_groups` groups:
    the loop's own rule) counted."""

    client: BufferClient
    min_groups: int
    sample_ms: list[float] = field(default_factory=list)
    waited_ms: list[float] = field(default_factory=list)
    staleness: collections.Counter[int] = field(default_factory=collections.Counter)

    def sample(self, spec: SampleSpec) -> Batch:
        begin = time.perf_counter()
        batch = self.client.sample(spec)
        self.sample_ms.append((time.perf_counter() - begin - batch.waited_s) * 1000)
        self.waited_ms.append(batch.waited_s * 1000)
        if sum(1 for g in batch.groups if g.trajectories) >= self.min_groups:
            for group in batch.groups:
                for t in group.trajectories:
                    self.staleness[max(0, batch.latest_version - t.policy_version)] += 1
        return batch


@dataclass
class ScaleResult:
    searchers: int
    wait_s: list[float]  # per step, the first left out
    sample_ms: list[float]  # each call less its wait in the buffer
    sample_waited_ms: list[float]  # each call's wait in the buffer (long poll)
    staleness: collections.Counter[int]
    searched: SearcherReport
    step_s: list[float]  # per step, all phases, the first left out
    # Cores each part kept busy while the trainer ran (1.0: one core).
    cores: dict[str, float]
    # Sample p50 and p99 as the service timed its handling, ms.
    served_ms: tuple[float, float]
    # Share of the trainer's run in which some task waited for a core; None: not reported.
    cpu_pressure: float | None

    @property
    def ingest_per_s(self) -> float:
        return self.searched.acknowledged / self.searched.elapsed_s

    @property
    def nominal_per_s(self) -> float:
        return self.searchers * PROMPTS_PER_ROUND * SAMPLES_PER_PROMPT / ROUND_LATENCY_S

    @property
    def wait_ms(self) -> float:
        return float(np.mean(self.wait_s)) * 1000

    @property
    def staleness_mean(self) -> float:
        return sum(v * c for v, c in self.staleness.items()) / sum(self.staleness.values())

    def sample_p(self, q: float) -> float:
        return float(np.percentile(self.sample_ms, q))

    def staleness_shares(self) -> str:
        total = sum(self.staleness.values())
        return ", ".join(f"{v}: {c / total:.0%}" for v, c in sorted(self.staleness.items()))

    def summary(self) -> str:
        return (
            f"N={self.searchers}: wait {self.wait_ms:.0f} ms/step, "
            f"ingest {self.ingest_per_s:.0f}/s (nominal {self.nominal_per_s:.0f}/s), "
            f"{self.searched.rounds} rounds, {len(self.searched.errors)} errors, "
            f"Sample p50 {self.sample_p(50):.1f} ms p99 {self.sample_p(99):.1f} ms "
            f"({len(self.sample_ms)} calls, waiting {np.mean(self.sample_waited_ms):.0f} ms "
            f"each in the buffer; handled in p50 {self.served_ms[0]:.1f} "
            f"p99 {self.served_ms[1]:.1f} ms), staleness {self.staleness_shares()}, "
            f"step {np.mean(self.step_s) * 1000:.0f} ms, cores busy: "
            + ", ".join(f"{k} {v:.2f}" for k, v in self.cores.items())
            + ("" if self.cpu_pressure is None else f", CPU pressure {self.cpu_pressure:.0%}")
        )


def put_prompts(client: BufferClient) -> Tokens:
    """PROMPTS train prompts of the arithmetic task, and their tokens under the tiny model's
    tokenizer, as a searcher encodes them."""
    from tba.models.tiny import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    prompts = ArithmeticTask().prompts(Split.TRAIN)[:PROMPTS]
    ids = client.put_prompts(prompts).prompt_ids
    return Tokens(
        prompts={
            i: pack_tokens(tokenizer.encode(p.text)) for i, p in zip(ids, prompts, strict=True)
        },
        digits={d: tokenizer.convert_tokens_to_ids(d) for d in "0123456789"},
        eos=tokenizer.eos_token_id,
    )


def trainer_settings(root: Path, address: str, steps: int) -> TrainerRunSettings:
    overrides = {
        "client.address": address,
        "objectstore.uri": f"file://{root / 'store'}",
        "checkpoint.dir": str(root / "ckpt"),
        "checkpoint.every_steps": 0,
        "metrics.jsonl_path": str(root / "metrics.jsonl"),
        "metrics.stdout": False,
        "trainer.steps": steps,
        "trainer.device": "cpu",
    }
    return load_settings(TrainerRunSettings, DEMO, overrides, run_sections())


def handled_ms(http_url: str, method: str, quantiles: tuple[float, ...]) -> tuple[float, ...]:
    """Quantiles (ms) of the service's handling time of `method`, from its histogram."""
    text = httpx.get(f"{http_url}/metrics", timeout=10).text
    (family,) = [
        f
        for f in text_string_to_metric_families(text)
        if f.name == "tba_buffer_rpc_handling_seconds"
    ]
    buckets = sorted(
        (float(s.labels["le"]), s.value)
        for s in family.samples
        if s.name.endswith("_bucket") and s.labels["method"] == method
    )
    return tuple(bucket_quantile(buckets, q) * 1000 for q in quantiles)


def bucket_quantile(buckets: list[tuple[float, float]], q: float) -> float:
    """Prometheus' histogram_quantile: linear within the bucket where the cumulative count
    reaches q of the total (the largest finite bound where that is the +Inf bucket)."""
    rank = q * buckets[-1][1]
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank and count > lower_count:
            if math.isinf(bound):
                return lower_bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (
                count - lower_count
            )
        lower_bound, lower_count = bound, count
    return lower_bound


def train_against(
    service: BufferProcess, pids: dict[str, int], searchers: int, steps: int, root: Path
) -> ScaleResult:
    """The demo's trainer for `steps` steps while `searchers` simulated searchers post; the
    servers' CPU (`pids`) measured over the trainer's run."""
    from tba.models.loading import quiet_progress_bars
    from tba.trainer.main import build_loop

    quiet_progress_bars()  # as `tba trainer run` does: a bar per published version otherwise
    with BufferClient(BufferClientSettings(address=service.address)) as client:
        tokens = put_prompts(client)
    loop = build_loop(trainer_settings(root, service.address, steps))  # registers the run
    assert isinstance(loop.source, BufferClient)
    source = TimedSource(loop.source, loop.settings.min_batch_prompts)
    loop.source = source
    run = source.client.stats().run
    assert run is not None
    pool = SearcherPool(service.address, searchers, run.run_id, tokens)
    pool.start()
    before = {name: proc_stat(pid).cpu_s for name, pid in pids.items()}
    begin, cpu_begin, waited_begin = time.perf_counter(), time.process_time(), cpu_waited_s()
    try:
        loop.run()
    finally:
        run_s = time.perf_counter() - begin
        cores = {name: (proc_stat(pid).cpu_s - before[name]) / run_s for name, pid in pids.items()}
        cores["trainer"] = (time.process_time() - cpu_begin) / run_s
        waited_end = cpu_waited_s()
        searched = pool.stop()
        loop.metrics.close()
        source.client.close()
    cores["simulated searchers"] = searched.cpu_s / searched.elapsed_s
    p50, p99 = handled_ms(service.http_url, "Sample", (0.5, 0.99))
    metrics = [json.loads(line) for line in (root / "metrics.jsonl").read_text().splitlines()]
    waits = [m["time/wait_data_s"] for m in metrics[1:]]
    step_s = [sum(m[f"time/{p}_s"] for p in PHASES) for m in metrics[1:]]
    return ScaleResult(
        searchers,
        waits,
        source.sample_ms,
        source.waited_ms,
        source.staleness,
        searched,
        step_s,
        cores,
        (p50, p99),
        None if waited_begin is None or waited_end is None else (waited_end - waited_begin) / run_s,
    )


def measure(searchers: int, steps: int, root: Path) -> ScaleResult:
    """A fresh Redis and buffer service (the demo's [buffer] settings) for one N."""
    redis = start_redis(root / "redis")
    service = BufferProcess(["--config", str(DEMO), "--store", redis.url], root / "buffer.log")
    try:
        service.start()
        assert service.proc is not None
        pids = {"buffer service": service.proc.pid, "Redis": redis.pid}
        return train_against(service, pids, searchers, steps, root)
    finally:
        service.stop()
        redis.kill()


def run(quick: bool = False) -> list[Row]:
    if quick:
        return run_counts((1, 16), QUICK_STEPS)
    return run_counts(COUNTS, STEPS)


def run_counts(counts: Sequence[int], steps: int) -> list[Row]:
    import torch

    # One thread: the buffer, Redis and the searcher processes need the other core.
    torch.set_num_threads(1)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in counts:
            root = Path(tmp) / f"n{n}"
            root.mkdir()
            results.append(measure(n, steps, root))
            print(results[-1].summary(), flush=True)
    return rows(results)


def rows(results: list[ScaleResult]) -> list[Row]:
    first, last = results[0], results[-1]
    out = []
    for previous, r in zip([None, *results], results, strict=False):
        n = f"N={r.searchers}"
        out += [
            _wait_row(n, r, previous),
            Row(
                NAME,
                f"{n}: ingest (baseline: nominal)",
                r.ingest_per_s,
                "1/s",
                baseline=r.nominal_per_s,
                ratio=r.ingest_per_s / r.nominal_per_s,
            ),
            Row(
                NAME,
                f"{n}: ingest errors",
                len(r.searched.errors),
                "",
                target="== 0" if r is last else "",
                passed=not r.searched.errors if r is last else None,
            ),
            Row(NAME, f"{n}: Sample p50", r.sample_p(50), "ms"),
            _p99_row(n, r, first, r is last),
            Row(NAME, f"{n}: Sample p50, handling in the service", r.served_ms[0], "ms"),
            Row(NAME, f"{n}: Sample p99, handling in the service", r.served_ms[1], "ms"),
            Row(
                NAME, f"{n}: staleness mean ({r.staleness_shares()})", r.staleness_mean, "versions"
            ),
            Row(NAME, f"{n}: trainer step, all phases", float(np.mean(r.step_s)) * 1000, "ms"),
            *(Row(NAME, f"{n}: {part}, cores busy", c, "cores") for part, c in r.cores.items()),
        ]
        if r.cpu_pressure is not None:
            out.append(Row(NAME, f"{n}: CPU pressure, time a task waited", r.cpu_pressure, "share"))
    return out


def _wait_row(n: str, r: ScaleResult, previous: ScaleResult | None) -> Row:
    if previous is None:
        return Row(NAME, f"{n}: trainer wait for data per step", r.wait_ms, "ms")
    before = previous.wait_ms
    return Row(
        NAME,
        f"{n}: trainer wait for data per step",
        r.wait_ms,
        "ms",
        baseline=before,
        ratio=r.wait_ms / before,
        target=f"< N={previous.searchers}",
        passed=r.wait_ms < before,
    )


def _p99_row(n: str, r: ScaleResult, first: ScaleResult, last: bool) -> Row:
    ratio = r.sample_p(99) / first.sample_p(99)
    return Row(
        NAME,
        f"{n}: Sample p99",
        r.sample_p(99),
        "ms",
        baseline=first.sample_p(99),
        ratio=ratio,
        target=f"<= {SAMPLE_P99_RATIO:g}x N={first.searchers}" if last else "",
        passed=ratio <= SAMPLE_P99_RATIO if last else None,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--counts", default=",".join(map(str, COUNTS)), help="searcher counts N")
    parser.add_argument("--steps", type=int, default=STEPS, help="trainer steps per N")
    args = parser.parse_args()
    from bench.__main__ import print_table

    print_table(run_counts([int(n) for n in args.counts.split(",")], args.steps))


if __name__ == "__main__":
    main()
