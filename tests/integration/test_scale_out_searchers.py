"""Scale out with real processes: `tba buffer serve` (embedded store), `tba trainer run` and
three `tba searcher run`; one searcher is killed -9 mid-run and a fourth joins. The trainer
finishes its steps; the buffer counts under each searcher the trajectories it logged as posted
(the killed one: at least those) and still stores every trajectory it acknowledged; the killed
searcher's leased prompts are served again once the lease expires; the buffer's stats list all
four searchers."""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tba.buffer.config import BufferClientSettings
from tba.buffer.transport.grpc_client import BufferClient
from tba.domain import SampleSpec
from tests.fixtures.buffer_service import BufferProcess, start_buffer
from tests.fixtures.tba_processes import TbaProcess, searcher, trainer, wait_for

STEPS = 12
LEASE_S = 2.0  # short, so the killed searcher's prompts come back within the test
# 20 train prompts (25 pairs, 5 held out): 3 searchers leasing 4 each cycle through them all.
SEARCHER = {
    "searcher.lease_s": LEASE_S,
    "task.arithmetic.max_operand": 14,
    "task.arithmetic.test_size": 5,
}
# Every acknowledged trajectory stays stored: no de-duplication, no per-prompt eviction, and a
# recency window over every prompt so one Sample call shows each prompt's newest trajectory.
BUFFER = {"dedup": "false", "prompt_history": 10_000, "recency_window": 1_000}
ROUND = re.compile(r" round (\d+) .*?searcher/trajectories=(\S+)")


@pytest.fixture
def buffer(tmp_path: Path) -> Iterator[tuple[BufferProcess, BufferClient]]:
    args = [arg for key, value in BUFFER.items() for arg in ("--set", f"buffer.{key}={value}")]
    service = start_buffer(tmp_path, *args)
    client = BufferClient(BufferClientSettings(address=service.address, retries=2))
    yield service, client
    client.close()
    service.stop()


def posted(proc: TbaProcess) -> dict[int, int]:
    """Trajectories per round that the searcher logged; it logs a round once the buffer has
    acknowledged its AddTrajectories."""
    return {int(m[1]): int(float(m[2])) for m in ROUND.finditer(proc.log())}


def announced_version(client: BufferClient) -> int:
    latest = client.latest_weights()
    return latest.version if latest is not None else 0


def newest_created_s(client: BufferClient) -> dict[str, float]:
    """Each prompt's newest stored trajectory's creation time (recency sampling, K = 1, over
    a window holding every prompt)."""
    prompts = client.stats().prompts_with_trajectories
    if not prompts:
        return {}
    batch = client.sample(SampleSpec(prompts, 1, recency_probability=1.0))
    return {g.prompt.id: g.trajectories[0].created_at_s for g in batch.groups}


def all_served_since(client: BufferClient, since_s: float) -> bool:
    newest = newest_created_s(client)
    prompts = client.stats().prompts
    return len(newest) == prompts and min(newest.values()) > since_s


def stop(proc: TbaProcess) -> None:
    proc.signal(signal.SIGTERM)  # the searcher posts the round in progress and exits 0
    assert proc.wait_exit() == 0, proc.log()[-4000:]


@pytest.mark.slow
def test_a_searcher_killed_9_and_one_joining_lose_nothing_acknowledged(buffer, processes, tmp_path):
    service, client = buffer
    store_uri = f"file://{tmp_path / 'store'}"
    train = trainer(tmp_path, "trainer", service.address, store_uri, steps=STEPS)
    first = [
        searcher(tmp_path, service.address, store_uri, f"searcher-{i}", **SEARCHER)
        for i in (1, 2, 3)
    ]
    processes += [train, *first]
    for proc in processes:
        proc.start()
    doomed = first[1]
    wait_for("version 1 announced", lambda: announced_version(client) >= 1, *processes)
    # The trainer is held from its first publish while a searcher is killed and another
    # starts, so that both fall within its run (on 2 cores a searcher's start-up can outlast
    # the trainer's remaining steps).
    train.signal(signal.SIGSTOP)
    assert train.alive()
    wait_for("searcher-2 posting", lambda: len(posted(doomed)) >= 2, *first)
    doomed.kill()  # -9, almost surely holding a lease: it leases a round while posting one
    killed_at_s = time.time()
    joined = searcher(tmp_path, service.address, store_uri, "searcher-4", **SEARCHER)
    processes.append(joined)
    joined.start()
    survivors = [first[0], first[2], joined]
    wait_for("searcher-4 posting", lambda: posted(joined), *survivors)
    train.signal(signal.SIGCONT)
    assert train.wait_exit() == 0, train.log()[-4000:]
    assert f"trainer done: step {STEPS}" in train.log()
    wait_for(
        "every prompt served after the kill",
        lambda: all_served_since(client, killed_at_s),
        *survivors,
    )
    for proc in survivors:
        stop(proc)
    check_nothing_lost(client, survivors, doomed)


def check_nothing_lost(client: BufferClient, survivors: list[TbaProcess], doomed: TbaProcess):
    stats = client.stats()
    added = {s.searcher_id: s.trajectories_added for s in stats.searchers}
    assert sorted(added) == [f"searcher-{i}" for i in (1, 2, 3, 4)]
    for proc in survivors:
        assert added[proc.name] == sum(posted(proc).values()), proc.name
    # Killed, it may have been acknowledged for a round it did not live to log.
    assert 0 < sum(posted(doomed).values()) <= added[doomed.name]
    assert stats.trajectories == stats.trajectories_added_total == sum(added.values())
    assert stats.evicted_total == 0
    # The killed searcher's lease expired; the others acknowledged theirs before exiting.
    assert stats.leases_in_flight == 0
    assert stats.groups_sampled_total >= STEPS * 3  # the trainer drew from it throughout
    print(
        f"\nposted per searcher {added}; killed searcher logged "
        f"{sum(posted(doomed).values())}, buffer holds {stats.trajectories}"
    )
