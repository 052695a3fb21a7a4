"""Simulated searchers for `python -m bench scale`: each one the loop of a real searcher without
the model. Per round it reads the announced weight version, leases 16 prompts, sleeps a fixed
generation latency (0.5 s), then posts 8 completions per prompt over gRPC with the real
BufferClient, acknowledging the lease, tagged with the run and stamped with the version read.

Completions are the size the demo's searchers post: a sum near the right one in digits and
<eos> (at most `max_new_tokens` = 5 tokens) under the tiny char-level tokenizer, rewarded 1
when exact. Searchers are threads, each with its own BufferClient (its own gRPC channel),
spread over a few processes (`SearcherPool`) so that 64 of them fit 2 cores and the
trainer's process keeps its interpreter to itself. Those processes stand for machines of
their own, so they run at the lowest CPU priority: their own work (a quarter of a core at
N = 64) takes the time the buffer service, Redis and the trainer leave over instead of
sharing the cores with them as equals.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.context import SpawnProcess
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event

from tba.buffer.config import BufferClientSettings
from tba.buffer.transport.grpc_client import BufferClient
from tba.domain import Prompt, Trajectory, new_request_id, pack_tokens

ROUND_LATENCY_S = 0.5  # what generating one round takes a real searcher, simulated
PROMPTS_PER_ROUND = 16
SAMPLES_PER_PROMPT = 8
MAX_PROCESSES = 4
STOP_TIMEOUT_S = 60.0  # only a guard against a process that died without reporting
NICENESS = 19  # the searchers' processes' (see the module's docstring)


@dataclass(frozen=True)
class Tokens:
    """What a simulated searcher needs of the tokenizer: each prompt's token ids (as the
    searcher would have encoded it) and the ids of digits and <eos>."""

    prompts: dict[str, bytes]
    digits: dict[str, int]
    eos: int


@dataclass
class SearcherReport:
    """What the searchers of one process did: trajectories the buffer acknowledged, rounds
    posted, the seconds they ran, the CPU seconds their process used and every failed call."""

    acknowledged: int = 0
    rounds: int = 0
    elapsed_s: float = 0.0
    cpu_s: float = 0.0
    errors: list[str] = field(default_factory=list)


def completions(
    prompt: Prompt, version: int, tokens: Tokens, rng: random.Random
) -> list[Trajectory]:
    """SAMPLES_PER_PROMPT trajectories of `prompt`: the right sum or one off by up to 2."""
    out = []
    for _ in range(SAMPLES_PER_PROMPT):
        text = str(int(prompt.answer) + rng.choice((0, 0, -2, -1, 1, 2)))
        ids = [tokens.digits[c] for c in text] + [tokens.eos]
        out.append(
            Trajectory(
                prompt_id=prompt.id,
                prompt_token_ids=tokens.prompts[prompt.id],
                completion_token_ids=pack_tokens(ids),
                completion_text=text,
                reward=float(text == prompt.answer),
                ref_logprob=-2.3 * len(ids) + rng.random(),
                behavior_logprob=-2.3 * len(ids) + rng.random(),
                policy_version=version,
                created_at_s=time.time(),
            )
        )
    return out


def one_round(
    client: BufferClient, name: str, run_id: str, tokens: Tokens, rng: random.Random
) -> int:
    """Lease, generate (sleep), post; the trajectories acknowledged (0: no prompt free)."""
    latest = client.latest_weights()
    version = latest.version if latest is not None else 0
    lease = client.lease_prompts(name, PROMPTS_PER_ROUND)
    time.sleep(ROUND_LATENCY_S)  # generating; with no prompt free, waiting as long to retry
    if not lease.prompts:
        return 0
    batch = [t for p in lease.prompts for t in completions(p, version, tokens, rng)]
    result = client.add_trajectories(
        batch, searcher_id=name, request_id=new_request_id(), lease_id=lease.lease_id, run_id=run_id
    )
    return result.accepted


def searcher_thread(
    address: str, name: str, run_id: str, tokens: Tokens, stop: Event, report: SearcherReport
) -> None:
    """Rounds until `stop`; a failed call is recorded and the searcher goes on."""
    rng = random.Random(name)
    with BufferClient(BufferClientSettings(address=address)) as client:
        while not stop.is_set():
            try:
                acknowledged = one_round(client, name, run_id, tokens, rng)
            except Exception as exc:  # counted: the benchmark's target is no error at all
                report.errors.append(f"{name}: {exc!r}")
                continue
            report.acknowledged += acknowledged
            report.rounds += acknowledged > 0


def searcher_process(
    address: str,
    names: list[str],
    run_id: str,
    tokens: Tokens,
    stop: Event,
    results: Queue[SearcherReport],
) -> None:
    """One process's searchers as threads, a report each; sends their sum once `stop` is set."""
    os.nice(NICENESS)
    reports = [SearcherReport() for _ in names]
    begin, cpu_begin = time.perf_counter(), time.process_time()
    threads = [
        threading.Thread(target=searcher_thread, args=(address, n, run_id, tokens, stop, r))
        for n, r in zip(names, reports, strict=True)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    report = summed(reports, time.perf_counter() - begin)
    report.cpu_s = time.process_time() - cpu_begin
    results.put(report)


def summed(reports: list[SearcherReport], elapsed_s: float) -> SearcherReport:
    return SearcherReport(
        acknowledged=sum(r.acknowledged for r in reports),
        rounds=sum(r.rounds for r in reports),
        elapsed_s=elapsed_s,
        cpu_s=sum(r.cpu_s for r in reports),
        errors=[e for r in reports for e in r.errors],
    )


class SearcherPool:
    """`count` simulated searchers in up to MAX_PROCESSES spawned processes."""

    def __init__(self, address: str, count: int, run_id: str, tokens: Tokens) -> None:
        context = multiprocessing.get_context("spawn")  # no torch or gRPC state forked
        self._stop = context.Event()
        self._results: Queue[SearcherReport] = context.Queue()
        names = [f"sim-{i}" for i in range(count)]
        processes = min(count, MAX_PROCESSES)
        self._processes: list[SpawnProcess] = [
            context.Process(
                target=searcher_process,
                args=(address, names[i::processes], run_id, tokens, self._stop, self._results),
            )
            for i in range(processes)
        ]

    def start(self) -> None:
        for process in self._processes:
            process.start()

    def stop(self) -> SearcherReport:
        """Stops every searcher after its round in progress; their reports summed (elapsed:
        the longest)."""
        self._stop.set()
        parts = [self._results.get(timeout=STOP_TIMEOUT_S) for _ in self._processes]
        for process in self._processes:
            process.join()
        return summed(parts, max(p.elapsed_s for p in parts))
