"""Searcher throughput: completion tokens/s of each engine bare (`engine.generate` in a loop)
and inside the searcher loop (`SearcherLoop.run`: lease from a real buffer service in a
subprocess with the memory store, generate, and on the finish worker reward, reference
log-probs and AddTrajectories, overlapping the next round's generation), in the same run on
the same engine. Bare and loop blocks of rounds alternate so that drift hits both alike.
Target: loop / bare >= 0.90.

The loop's rate is its steady state: the tokens of every round of a block but the first,
over their `round_s` (the loop's seconds from one hand-over to the next, which include any
wait for the previous round's finish). A second row divides all the tokens of the blocks by
the whole seconds of `run()`, the first round (nothing to overlap) and the final join (one
finish not overlapped) included, which a searcher pays once, at start and stop. A third row
runs the same rounds one at a time (`SearcherLoop.round`: generate, then finish, no overlap),
what the loop did before its finish stage moved to a worker thread. The last row shows the
finish stage's seconds per round against generation's: below 1, the finish can hide behind
generation.

Hiding it needs a core to spare. On a machine busy with other work the searcher gets a share
of the cores whatever it runs (Linux shares them out per session, `sched_autogroup`), so the
finish stage's CPU comes out of generation's: the loop then runs at about bare / loop CPU
seconds per token, which a further row gives (this process and its engine processes, the
buffer service left out, from /proc), whatever the load. A line per engine gives the mean
seconds of each phase per round, and the CPU seconds of the reference forward pass.

The vLLM engine is included when `import vllm` works. `--quick` uses the 3-layer demo model;
the full run a 6-layer, 256-wide one with longer completions.
"""

from __future__ import annotations

import functools
import os
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from bench.common import Row, engine_kinds, proc_stat
from tba.buffer.config import BufferClientSettings
from tba.buffer.transport.grpc_client import BufferClient
from tba.models.config import ModelSettings
from tba.objectstore.config import ObjectStoreSettings
from tba.searcher.config import EngineSettings, SearcherRunSettings, SearcherSettings
from tba.searcher.engine import SamplingParams
from tba.searcher.finish import ReferenceLogprobs, ReferenceModel
from tba.searcher.main import Searcher, build_searcher
from tba.tasks.base import Split
from tba.tasks.config import TaskSettings
from tba.tasks.registry import build_task
from tests.fixtures.buffer_service import BufferProcess, start_buffer
from tests.fixtures.runs import run_of

TARGET_RATIO = 0.90
LOOP_PHASES = ("weights_s", "lease_s", "generate_s", "wait_finish_s")
FINISH_PHASES = ("reward_s", "reference_s", "post_s")


def _settings(kind: str, address: str, root: Path, quick: bool) -> SearcherRunSettings:
    layers, width, new_tokens, samples = (3, 128, 32, 8) if quick else (6, 256, 128, 16)
    return SearcherRunSettings(
        searcher=SearcherSettings(
            id=f"bench-{kind}",
            prompts_per_round=8,
            samples_per_prompt=samples,
            max_new_tokens=new_tokens,
            weights_dir=str(root / f"weights-{kind}"),
        ),
        engine=EngineSettings(kind=kind, device="cpu", enforce_eager=True),
        model=ModelSettings(tiny_layers=layers, tiny_width=width, tiny_positions=256),
        task=TaskSettings(),
        client=BufferClientSettings(address=address),
        objectstore=ObjectStoreSettings(uri=f"file://{root / 'store'}"),
    )


@dataclass
class RecordedRounds:
    """The loop's metrics, each round's values kept as well as written on."""

    inner: Any
    rounds: list[dict[str, float]] = field(default_factory=list)

    def write(self, round_index: int, values: Mapping[str, float]) -> None:
        self.rounds.append(dict(values))
        self.inner.write(round_index, values)


@dataclass
class CpuTimedReference:
    """The reference scorer with its CPU seconds summed: the finish stage's main cost, which
    unlike its wall seconds does not grow with other work on the machine."""

    inner: ReferenceModel
    cpu_s: float = 0.0

    def score(
        self,
        prompts: Sequence[Sequence[int]],
        completions: Sequence[Sequence[int]],
        temperature: float,
    ) -> list[ReferenceLogprobs]:
        started = time.thread_time()
        values = self.inner.score(prompts, completions, temperature)
        self.cpu_s += time.thread_time() - started
        return values


def tree_cpu_s(root_pid: int, exclude_pid: int) -> float:
    """CPU seconds (user + system) so far of `root_pid` and its descendants, but not of
    `exclude_pid` and its own (the buffer service, which a searcher does not run), from
    /proc: an engine's worker processes (vLLM's) count as the searcher's."""
    children: dict[int, list[int]] = {}
    cpu_s: dict[int, float] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        pid = int(stat.parent.name)
        try:
            process = proc_stat(pid)
        except OSError:  # exited meanwhile
            continue
        children.setdefault(process.parent_pid, []).append(pid)
        cpu_s[pid] = process.cpu_s
    total_s, todo = 0.0, [root_pid]
    while todo:
        pid = todo.pop()
        if pid != exclude_pid:
            total_s += cpu_s.get(pid, 0.0)
            todo += children.get(pid, [])
    return total_s


@dataclass
class Totals:
    bare_tokens: int = 0
    bare_s: float = 0.0
    steady_tokens: float = 0.0
    steady_s: float = 0.0
    run_tokens: float = 0.0
    run_s: float = 0.0
    sequential_tokens: float = 0.0
    sequential_s: float = 0.0
    rounds: int = 0
    generate_s: float = 0.0
    finish_s: float = 0.0
    phase_s: dict[str, float] = field(default_factory=dict)
    reference_cpu_s: float = 0.0
    bare_cpu_s: float = 0.0
    run_cpu_s: float = 0.0


def _bare_block(searcher: Searcher, batches: list[list[list[int]]], totals: Totals) -> None:
    s = searcher.loop.settings
    for seed, prompts in enumerate(batches):
        params = SamplingParams(
            s.samples_per_prompt, s.max_new_tokens, s.temperature, s.top_p, seed
        )
        started = time.perf_counter()
        out = searcher.engine.generate(prompts, params)
        totals.bare_s += time.perf_counter() - started
        totals.bare_tokens += sum(len(c.token_ids) for group in out for c in group)


def _loop_block(searcher: Searcher, recorded: RecordedRounds, rounds: int, totals: Totals) -> None:
    loop = searcher.loop
    loop.settings = loop.settings.model_copy(update={"max_rounds": loop.rounds + rounds})
    recorded.rounds.clear()
    assert isinstance(loop.reference, CpuTimedReference)
    cpu_s = loop.reference.cpu_s
    started = time.perf_counter()
    loop.run()
    totals.run_s += time.perf_counter() - started
    totals.reference_cpu_s += loop.reference.cpu_s - cpu_s
    assert len(recorded.rounds) == rounds, "the buffer ran out of free prompts"
    for index, values in enumerate(recorded.rounds):
        totals.rounds += 1
        totals.run_tokens += values["searcher/tokens"]
        totals.generate_s += values["searcher/generate_s"]
        totals.finish_s += sum(values[f"searcher/{phase}"] for phase in FINISH_PHASES)
        for phase in LOOP_PHASES + FINISH_PHASES:
            totals.phase_s[phase] = totals.phase_s.get(phase, 0.0) + values[f"searcher/{phase}"]
        if index > 0:  # the block's first round has no finish to overlap behind it
            totals.steady_tokens += values["searcher/tokens"]
            totals.steady_s += values["searcher/round_s"]


def _sequential_block(searcher: Searcher, rounds: int, totals: Totals) -> None:
    for _ in range(rounds):
        started = time.perf_counter()
        values = searcher.loop.round()
        totals.sequential_s += time.perf_counter() - started
        assert values is not None, "the buffer had no free prompt"
        totals.sequential_tokens += values["searcher/tokens"]


def _measure(kind: str, service: BufferProcess, root: Path, quick: bool) -> Totals:
    settings = _settings(kind, service.address, root, quick)
    assert service.proc is not None
    cpu = functools.partial(tree_cpu_s, os.getpid(), service.proc.pid)
    s = settings.searcher
    run = run_of(settings.model, settings.task, s.temperature, s.max_new_tokens, seed=s.seed)
    with BufferClient(settings.client) as client:
        client.register_run(run)
    searcher = build_searcher(settings)
    assert searcher is not None
    recorded = RecordedRounds(searcher.loop.metrics)
    searcher.loop.metrics = recorded
    searcher.loop.reference = CpuTimedReference(searcher.loop.reference)
    blocks, rounds = (3, 8) if quick else (3, 5)
    try:
        tokenizer: Any = searcher.loop.tokenizer
        texts = [p.text for p in build_task(settings.task).prompts(Split.TRAIN)]
        per_round = settings.searcher.prompts_per_round
        batches = [
            [tokenizer.encode(t) for t in texts[r * per_round : (r + 1) * per_round]]
            for r in range(rounds)
        ]
        # Warm-up: one bare round and one loop round, not counted.
        _bare_block(searcher, batches[:1], Totals())
        searcher.loop.round()
        totals = Totals()
        for _ in range(blocks):
            cpu_s = cpu()
            _bare_block(searcher, batches, totals)
            totals.bare_cpu_s += cpu() - cpu_s
            cpu_s = cpu()
            _loop_block(searcher, recorded, rounds, totals)
            totals.run_cpu_s += cpu() - cpu_s
            _sequential_block(searcher, rounds, totals)
    finally:
        searcher.close()
    return totals


def _print_phases(kind: str, t: Totals) -> None:
    """Mean seconds of each phase per pipelined round: the loop thread's, then the finish
    worker's (which overlap the next round's generation)."""

    def means(phases: tuple[str, ...]) -> str:
        return ", ".join(f"{p.removesuffix('_s')} {t.phase_s[p] / t.rounds:.3f}" for p in phases)

    print(
        f"{kind} seconds per round: loop thread {means(LOOP_PHASES)}; "
        f"finish worker {means(FINISH_PHASES)} (reference CPU {t.reference_cpu_s / t.rounds:.3f})",
        flush=True,
    )


def _rows(kind: str, t: Totals) -> list[Row]:
    _print_phases(kind, t)
    bare = t.bare_tokens / t.bare_s
    steady = t.steady_tokens / t.steady_s
    whole = t.run_tokens / t.run_s
    sequential = t.sequential_tokens / t.sequential_s
    bare_cpu = 1000 * t.bare_cpu_s / t.bare_tokens
    loop_cpu = 1000 * t.run_cpu_s / t.run_tokens
    return [
        Row("searcher", f"{kind} bare generate", bare, "tokens/s"),
        Row(
            "searcher",
            f"{kind} searcher loop, steady state",
            steady,
            "tokens/s",
            baseline=bare,
            ratio=steady / bare,
            target=f">= {TARGET_RATIO} x bare generate",
            passed=steady / bare >= TARGET_RATIO,
        ),
        Row(
            "searcher",
            f"{kind} searcher loop, whole runs with start and final join",
            whole,
            "tokens/s",
            baseline=bare,
            ratio=whole / bare,
        ),
        Row(
            "searcher",
            f"{kind} searcher CPU per 1k tokens, whole runs (ratio: bare / loop)",
            loop_cpu,
            "s",
            baseline=bare_cpu,
            ratio=bare_cpu / loop_cpu,
        ),
        Row(
            "searcher",
            f"{kind} rounds one at a time, no overlap",
            sequential,
            "tokens/s",
            baseline=bare,
            ratio=sequential / bare,
        ),
        Row(
            "searcher",
            f"{kind} finish stage (reward, reference, post) per round",
            t.finish_s / t.rounds,
            "s",
            baseline=t.generate_s / t.rounds,
            ratio=t.finish_s / t.generate_s,
        ),
    ]


def run(quick: bool) -> list[Row]:
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    kinds = engine_kinds()
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="tba-bench-searcher-") as tmp:
        root = Path(tmp)
        service = start_buffer(root)
        try:
            for kind in kinds:
                rows += _rows(kind, _measure(kind, service, root=root, quick=quick))
        finally:
            service.stop()
    return rows
