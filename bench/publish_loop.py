"""Training with weights published every step against training without, in one run: the
project's own `TrainerLoop` (draw, `train_on_batch`, publish) on a ~100M-parameter model
(`--quick`: ~2M), publishing (a) off, (b) in the background to `file://`, (c) in the
background to a SeaweedFS `s3://` server and (d) synchronously to `file://`, for contrast.

All cases train one engine (model and AdamW state), in segments of a few steps taken in turn,
the order reversed every other round (ABCD DCBA), so drift of this shared machine hits every
case alike. Each case first writes its publisher's first version, untimed (it goes through
`save_pretrained` once per trainer). Each segment starts with one untimed step, so a
publisher thread is already at work when the clock starts, and ends by waiting for the
publisher to finish (untimed, shown as the drain). Batches come from a fixed pool of
synthetic trajectories (random tokens, as a buffer would hand them over); what is timed is
the trainer's work on them, not their content.

Targets (issue 16): over `file://`, steps per second publishing every step in the background
at least 0.9x those with publishing off; over `s3://`, `time/publish_blocking_s` (the
snapshot the step takes) under 5% of the step. SeaweedFS runs on the same cores as the
trainer, so its CPU is a cost here that a separate object store would not put on the trainer.

`python -m bench.publish_loop [--quick]` runs it alone; `python -m bench publish` runs it after
the publish + reload comparison.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers.utils import logging as transformers_logging

from bench.common import Row, proc_stat
from bench.synthetic_source import SyntheticSource
from tba.models.config import ModelSettings
from tba.objectstore import ObjectStore, open_object_store
from tba.objectstore.local import FileStore
from tba.objectstore.weights import MANIFEST, read_latest, version_key
from tba.trainer.config import OptimSettings, TrainerSettings
from tba.trainer.engine import LocalEngine
from tba.trainer.loop import TrainerLoop
from tba.trainer.loss import TrajectoryBalance
from tba.trainer.model import load_policy
from tba.trainer.publish import StorePublisher
from tba.trainer.reference import ReferenceResets
from tests.fixtures.seaweedfs import SeaweedServer, store_settings

TARGET_RATE_RATIO = 0.9
TARGET_BLOCKING_SHARE = 0.05
_TEMPERATURE = 1.0
_NAME = "publish loop"


@dataclass(frozen=True)
class Size:
    """The model, the batch each step trains on (B groups of K rows), and the rounds."""

    model: ModelSettings
    prompts: int = 2
    samples: int = 4
    prompt_tokens: int = 8
    completion_tokens: int = 24
    rounds: int = 2
    steps_per_segment: int = 3  # timed steps; one untimed step comes before them


# 100M parameters, fp32 AdamW on one thread: an 8 x 32-token batch is a step of about 3 CPU
# seconds; 2 rounds of 4 cases x (1 + 3) steps keep the run to a few minutes on 2 cores.
FULL = Size(ModelSettings(tiny_layers=14, tiny_width=768, tiny_heads=12, tiny_positions=1024))
QUICK = Size(ModelSettings(tiny_layers=2, tiny_width=256, tiny_heads=4, tiny_positions=256))


@dataclass(frozen=True)
class Case:
    name: str
    store: str  # "" (publishing off), "file" or "s3"
    background: bool = True


CASES = (
    Case("publishing off", ""),
    Case("file:// background", "file"),
    Case("s3:// background", "s3"),
    Case("file:// synchronous", "file", background=False),
)


class _Discard:
    """The metrics sink: the loop's values are read from `train_step`'s return."""

    def write(self, step: int, values: Mapping[str, float]) -> None:
        return None

    def close(self) -> None:
        return None


@dataclass(frozen=True)
class Clocks:
    """What a segment reads: wall time; this (the training) thread's CPU time and its time
    runnable but waiting for a core (Linux schedstat); the CPU time of the whole process,
    finished threads included; the object-store server's CPU time."""

    wall_s: float
    thread_cpu_s: float
    runqueue_s: float
    process_cpu_s: float
    server_cpu_s: float

    @staticmethod
    def read(server_pid: int) -> Clocks:
        runqueue_ns = int(Path("/proc/thread-self/schedstat").read_text().split()[1])
        return Clocks(
            time.perf_counter(),
            time.thread_time(),
            runqueue_ns / 1e9,
            time.process_time(),
            proc_stat(server_pid).cpu_s,
        )


@dataclass
class Tally:
    """One case's segments: the timed steps, and what its publisher did over the segments."""

    window_s: float = 0.0  # wall seconds of the timed steps
    steps: int = 0
    trainer_cpu_s: float = 0.0  # the training thread's, over the timed steps
    runqueue_s: float = 0.0  # the training thread waiting for a core, over the timed steps
    blocking_s: float = 0.0  # sum of time/publish_blocking_s over the timed steps
    background_s: list[float] = field(default_factory=list)  # time/publish_background_s
    round_rates: list[float] = field(default_factory=list)  # steps/s of each round's segment
    versions: int = 0
    skipped: int = 0
    drain_s: float = 0.0
    # CPU of this process's other threads (the publisher's), and of the server, over whole
    # segments: the untimed step and the drain too, so every version written is in them.
    publishing_cpu_s: float = 0.0
    server_cpu_s: float = 0.0

    @property
    def rate(self) -> float:
        return self.steps / self.window_s

    def add_timed(self, before: Clocks, after: Clocks, values: list[dict[str, float]]) -> None:
        window_s = after.wall_s - before.wall_s
        self.window_s += window_s
        self.steps += len(values)
        self.round_rates.append(len(values) / window_s)
        self.trainer_cpu_s += after.thread_cpu_s - before.thread_cpu_s
        self.runqueue_s += after.runqueue_s - before.runqueue_s
        self.blocking_s += sum(v["time/publish_blocking_s"] for v in values)
        self.background_s += [v["time/publish_background_s"] for v in values]

    def add_whole(self, before: Clocks, after: Clocks) -> None:
        thread_cpu_s = after.thread_cpu_s - before.thread_cpu_s
        self.publishing_cpu_s += after.process_cpu_s - before.process_cpu_s - thread_cpu_s
        self.server_cpu_s += after.server_cpu_s - before.server_cpu_s


def _loop(
    engine: LocalEngine, tokenizer: Any, size: Size, case: Case, store: ObjectStore
) -> TrainerLoop:
    """The trainer's loop as `tba trainer run` wires it, publishing every step, or never (a
    publish period past the run: the publisher is never called)."""
    settings = TrainerSettings(
        steps=1_000_000,
        num_prompts=size.prompts,
        samples_per_prompt=size.samples,
        micro_batch_size=size.prompts * size.samples,
        publish_every_steps=1 if case.store else 1_000_000,
        keep_versions=2,
    )
    publisher = StorePublisher(
        store,
        engine,
        tokenizer,
        lambda _: None,
        settings.keep_versions,
        export_dtype=torch.float32,  # [model] dtype's default
        background=case.background,
    )
    pad = tokenizer.pad_token_id
    return TrainerLoop(
        settings=settings,
        engine=engine,
        source=SyntheticSource(
            tokenizer, size.prompt_tokens, size.completion_tokens, per_group=2 * size.samples
        ),
        publisher=publisher,
        metrics=_Discard(),
        objective=TrajectoryBalance(),
        reference=ReferenceResets(0, _TEMPERATURE, pad, settings.micro_batch_size),
        pad_token_id=pad,
        temperature=_TEMPERATURE,
    )


def _announced(loop: TrainerLoop) -> int:
    announced = loop.publisher.progress().announced
    return announced.version if announced is not None else 0


def _segment(loop: TrainerLoop, steps: int, tally: Tally, server_pid: int) -> None:
    """One untimed step (a background publisher is then at work), `steps` timed steps, then
    the publisher drained."""
    versions, skipped = _announced(loop), loop.publisher.progress().skipped
    started = Clocks.read(server_pid)
    loop.train_step()
    timed = Clocks.read(server_pid)
    values = [loop.train_step() for _ in range(steps)]
    stepped = Clocks.read(server_pid)
    drained = loop.publisher.drain()
    ended = Clocks.read(server_pid)
    tally.add_timed(timed, stepped, values)
    tally.add_whole(started, ended)
    tally.drain_s += ended.wall_s - stepped.wall_s
    tally.versions += _announced(loop) - versions
    tally.skipped += drained.skipped - skipped


def _rounds(loops: dict[Case, TrainerLoop], size: Size, server_pid: int) -> dict[Case, Tally]:
    """Segments of every case in turn, the order reversed every other round, after one
    untimed step of each case with its publisher drained: a publisher's first version goes
    through `save_pretrained` and reads it back to learn the direct write (`VersionFiles`),
    once per trainer, which would otherwise fall in the first round's timed steps."""
    for loop in loops.values():
        loop.train_step()
        loop.publisher.drain()
    tallies = {case: Tally() for case in loops}
    for number in range(size.rounds):
        order = list(loops) if number % 2 == 0 else list(reversed(loops))
        for case in order:
            _segment(loops[case], size.steps_per_segment, tallies[case], server_pid)
    for loop in loops.values():
        loop.publisher.close()
    return tallies


def _row(case: Case, what: str, value: float, unit: str, **checked: Any) -> Row:
    return Row(_NAME, f"{case.name}: {what}", value, unit, **checked)


def _rate_rows(tallies: dict[Case, Tally]) -> list[Row]:
    """Steps per second of each case against publishing off, overall and in the worst round."""
    off = tallies[CASES[0]]
    rows = [_row(CASES[0], "steps/s", off.rate, "steps/s")]
    for case in CASES[1:]:
        tally = tallies[case]
        ratio = tally.rate / off.rate
        rounds = [r / o for r, o in zip(tally.round_rates, off.round_rates, strict=True)]
        checked = case.store == "file" and case.background
        target = f">= {TARGET_RATE_RATIO}x publishing off" if checked else ""
        passed = ratio >= TARGET_RATE_RATIO if checked else None
        what = f"steps/s (rounds {', '.join(f'{r:.2f}x' for r in rounds)})"
        checks = {"baseline": off.rate, "ratio": ratio, "target": target, "passed": passed}
        rows.append(_row(case, what, tally.rate, "steps/s", **checks))
    return rows


def _publish_rows(case: Case, tally: Tally) -> list[Row]:
    """What publishing cost the step, and what the publisher did, for one publishing case."""
    share = tally.blocking_s / tally.window_s
    checked = case.store == "s3" and case.background
    target = f"< {100 * TARGET_BLOCKING_SHARE:.0f}%" if checked else ""
    passed = share < TARGET_BLOCKING_SHARE if checked else None
    what = "time/publish_blocking_s share of the step"
    rows = [
        _row(case, what, 100 * share, "%", target=target, passed=passed),
        _row(case, "versions written", tally.versions, "versions"),
        _row(case, "trainer/publish_skipped", tally.skipped, "snapshots"),
    ]
    if case.background:
        published = [s for s in tally.background_s if s > 0]
        median_s = statistics.median(published) if published else 0.0
        drain_s = tally.drain_s / len(tally.round_rates)
        rows.append(_row(case, "time/publish_background_s, median", median_s, "s"))
        rows.append(_row(case, "drain after a segment", drain_s, "s"))
    return rows


def _cpu_rows(case: Case, tally: Tally) -> list[Row]:
    """Where the time went: the training thread's CPU and its wait for a core per timed step
    (a saturated machine shows in the wait), and the CPU each version cost."""
    rows = [
        _row(case, "training thread CPU per step", tally.trainer_cpu_s / tally.steps, "cpu-s"),
        _row(
            case, "training thread waiting for a core per step", tally.runqueue_s / tally.steps, "s"
        ),
    ]
    versions = max(tally.versions, 1)
    if case.store:
        per_version = tally.publishing_cpu_s / versions
        rows.append(
            _row(case, "publishing CPU per version (trainer's other threads)", per_version, "cpu-s")
        )
    if case.store == "s3":
        rows.append(_row(case, "SeaweedFS CPU per version", tally.server_cpu_s / versions, "cpu-s"))
    else:  # idle, unless it still works on an upload of the s3:// case's
        rows.append(_row(case, "SeaweedFS CPU in the segments", tally.server_cpu_s, "cpu-s"))
    return rows


def _version_bytes(store: ObjectStore) -> int:
    """Bytes of the newest version in `store`: its files and its manifest."""
    latest = read_latest(store)
    assert latest is not None
    raw = store.get_bytes(f"{version_key(latest.version)}/{MANIFEST}")
    return len(raw) + sum(entry["bytes"] for entry in json.loads(raw)["files"].values())


def _bytes_rows(
    fp32_store: ObjectStore, engine: LocalEngine, tokenizer: Any, root: Path
) -> list[Row]:
    """Bytes per version: a version the fp32 loop wrote, and the same weights exported bf16."""
    bf16_store = FileStore(f"file://{root / 'bf16'}")
    StorePublisher(
        bf16_store, engine, tokenizer, lambda _: None, 1, export_dtype=torch.bfloat16
    ).publish(0, after_version=0)
    fp32_mb, bf16_mb = _version_bytes(fp32_store) / 1e6, _version_bytes(bf16_store) / 1e6
    return [
        Row(_NAME, "bytes per version, fp32 export", fp32_mb, "MB"),
        Row(_NAME, "bytes per version, bf16 export", bf16_mb, "MB", fp32_mb, bf16_mb / fp32_mb),
    ]


def _store(case: Case, root: Path, server: SeaweedServer) -> ObjectStore:
    if case.store == "s3":
        return open_object_store(store_settings(server.s3))
    # Publishing off gets a store too; its publisher is never called.
    return FileStore(f"file://{root / case.name.replace(' ', '-').replace('/', '')}")


def run(quick: bool) -> list[Row]:
    # One torch thread unless OMP_NUM_THREADS says otherwise, as bench_publish and `tba local`
    # (2 cores: one each is best): the publisher thread and SeaweedFS take the other core.
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    size = QUICK if quick else FULL
    # A progress bar per publish would bury the table.
    transformers_logging.disable_progress_bar()
    tokenizer, model = load_policy(size.model, seed=0)
    engine = LocalEngine(model, OptimSettings(lr=1e-6), total_steps=1_000_000)
    params_m = sum(p.numel() for p in model.parameters()) / 1e6
    rows = [
        Row(_NAME, "model parameters", params_m, "M"),
        Row(
            _NAME,
            f"batch: {size.prompts} x {size.samples} rows of "
            f"{size.prompt_tokens} + {size.completion_tokens} tokens; timed steps per case",
            size.rounds * size.steps_per_segment,
            "steps",
        ),
    ]
    with tempfile.TemporaryDirectory(prefix="tba-bench-publish-loop-") as tmp:
        root = Path(tmp)
        (root / "weed").mkdir()
        server = SeaweedServer(root / "weed")
        try:
            server.start()
            assert server.proc is not None
            stores = {case: _store(case, root, server) for case in CASES}
            loops = {case: _loop(engine, tokenizer, size, case, stores[case]) for case in CASES}
            tallies = _rounds(loops, size, server.proc.pid)
        finally:
            server.kill()
        rows += _rate_rows(tallies)
        for case in CASES[1:]:
            rows += _publish_rows(case, tallies[case])
        for case in CASES:
            rows += _cpu_rows(case, tallies[case])
        rows += _bytes_rows(stores[CASES[1]], engine, tokenizer, root)
    return rows


def main() -> None:
    from bench.__main__ import print_table

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="the ~2M-parameter model")
    print_table(run(parser.parse_args().quick))


if __name__ == "__main__":
    main()
