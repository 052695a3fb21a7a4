"""The one-machine demo's learning across base models: from each base, the default async demo
(`tba local`), its on-policy baseline (`tba local --mode sync`) and a plain single-process
on-policy RLOO loop (bench/plain_loop.py: no services, no buffer), one after another.

Bases: the committed demo base, the committed hard ones (bench/bases/*: bases from which the
previous demo defaults stalled) and fresh bootstraps with other seeds (where they land depends
on this machine's float rounding). Each run stops at held-out accuracy 0.90 or after
`LIMIT_S`. Reported per base and mode: seconds and trainer steps to base + 0.25, 0.80 and
0.90, and the best accuracy; then per mode the median and the worst over bases, and the
ratios async / sync and async / loop of the median times. A missed accuracy counts as the
run's limit (a bound). Targets: every base reaches 0.80 within 3 minutes and 0.90 within 8
with TB async, and the async median is below the loop's.

`python -m bench local` runs it all (about an hour or more); `python -m bench.bench_local
--bases demo,hard-1 --modes async,loop` runs a part; `--quick` runs the demo base only, 300
steps a mode.
"""

from __future__ import annotations

import argparse
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from bench.common import Row
from tba.local.bases import DEMO_BASE, verified_base
from tba.local.bootstrap import bootstrap_base_model
from tba.local.config import BootstrapSettings
from tba.local.report import read_jsonl
from tba.models.loading import quiet_progress_bars
from tba.tasks.arithmetic import ArithmeticTask

HARD_BASES = Path(__file__).parent / "bases"
BOOTSTRAP_SEEDS = (11, 12)
MODES = ("async", "sync", "loop")
STOP_AT = 0.90
LIMIT_S = 480.0
# Held-out accuracy the async demo must reach on every base within so many seconds.
TARGETS_S = {0.80: 180.0, 0.90: 480.0}
POLL_S = 2.0
Points = list[dict[str, Any]]


def base_models(root: Path, names: Sequence[str] | None) -> dict[str, Path]:
    """Name -> model folder of every benchmark base (or of `names`), bootstrapping as needed."""
    bases = {"demo": verified_base(DEMO_BASE)}
    for folder in sorted(HARD_BASES.iterdir()):
        if folder.is_dir():
            bases[folder.name] = verified_base(folder)
    # One thread, as `tba local --set local.base=bootstrap` makes them.
    torch.set_num_threads(1)
    for seed in BOOTSTRAP_SEEDS:
        name = f"bootstrap-{seed}"
        if names is None or name in names:
            settings = BootstrapSettings(seed=seed)
            bases[name] = bootstrap_base_model(root / name, settings, ArithmeticTask())
    return {n: p for n, p in bases.items() if names is None or n in names}


def _local_command(run_dir: Path, base: Path, mode: str, steps: int | None) -> list[str]:
    cmd = [sys.executable, "-m", "tba", "local", "--run-dir", str(run_dir), "--mode", mode]
    cmd += ["--model", str(base), "--set", "local.progress=false"]
    return cmd + (["--steps", str(steps)] if steps is not None else [])


def _loop_command(run_dir: Path, base: Path, steps: int | None) -> list[str]:
    cmd = [sys.executable, "-m", "bench.plain_loop", "--model", str(base)]
    cmd += ["--out", str(run_dir / "eval.jsonl"), "--limit-s", str(LIMIT_S)]
    return cmd + (["--steps", str(steps)] if steps is not None else [])


def run_mode(run_dir: Path, base: Path, mode: str, steps: int | None) -> Points:
    """Eval points of one run, stopped (SIGTERM, as Ctrl-C) at `STOP_AT` or `LIMIT_S`."""
    run_dir.mkdir(parents=True, exist_ok=True)
    if mode == "loop":
        cmd = _loop_command(run_dir, base, steps)
    else:
        cmd = _local_command(run_dir, base, mode, steps)
    with subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL) as proc:
        while proc.poll() is None:
            points = read_points(run_dir)
            if points and (points[-1]["wall_s"] >= LIMIT_S or points[-1]["accuracy"] >= STOP_AT):
                proc.send_signal(signal.SIGTERM)
                break
            time.sleep(POLL_S)
        if proc.wait() not in (0, -signal.SIGTERM):
            raise RuntimeError(f"{mode} run failed: see {run_dir}")
    return read_points(run_dir)


def read_points(run_dir: Path) -> Points:
    # A line being written as this reads it is left for the next poll.
    return read_jsonl(run_dir / "eval.jsonl")


def first_reach(points: Points, accuracy: float) -> dict[str, Any] | None:
    return next((p for p in points if p["accuracy"] >= accuracy), None)


def levels(points: Points) -> dict[str, float]:
    base = points[0]["accuracy"]
    return {"base+0.25": base + 0.25, "0.80": 0.80, "0.90": 0.90}


def seconds_to(points: Points, accuracy: float) -> float | None:
    point = first_reach(points, accuracy)
    return None if point is None else float(point["wall_s"])


def _bound_s(points: Points, accuracy: float) -> float:
    """Seconds to `accuracy`, or the run's length where it was missed (a lower bound)."""
    reached = seconds_to(points, accuracy)
    return reached if reached is not None else max(LIMIT_S, points[-1]["wall_s"])


def base_rows(name: str, runs: dict[str, Points]) -> list[Row]:
    base = next(iter(runs.values()))[0]["accuracy"]
    rows = [Row("local", f"{name}: base held-out accuracy", base, "")]
    for mode, points in runs.items():
        for level, accuracy in levels(points).items():
            point = first_reach(points, accuracy)
            step = "missed" if point is None else f"step {point['step']}"
            seconds = float("nan") if point is None else float(point["wall_s"])
            rows.append(Row("local", f"{name} {mode}: s to {level} ({step})", seconds, "s"))
        best = max(p["accuracy"] for p in points)
        rows.append(Row("local", f"{name} {mode}: best accuracy", best, ""))
    return rows


def summary_rows(results: dict[str, dict[str, Points]]) -> list[Row]:
    """Median and worst over bases per mode, the async targets and the ratios of medians."""
    rows: list[Row] = []
    modes = [m for m in MODES if all(m in runs for runs in results.values())]
    for accuracy in (0.80, 0.90):
        medians = {}
        for mode in modes:
            times = [_bound_s(runs[mode], accuracy) for runs in results.values()]
            missed = sum(seconds_to(runs[mode], accuracy) is None for runs in results.values())
            note = f" ({missed} missed: counted as the limit)" if missed else ""
            medians[mode] = statistics.median(times)
            worst = max(times)
            target = TARGETS_S[accuracy] if mode == "async" else None
            rows.append(
                Row("local", f"{mode}: median s to {accuracy:.2f}{note}", medians[mode], "s")
            )
            rows.append(
                Row(
                    "local",
                    f"{mode}: worst s to {accuracy:.2f} over {len(times)} bases{note}",
                    worst,
                    "s",
                    target="" if target is None else f"<= {target:.0f} s",
                    passed=None if target is None else not missed and worst <= target,
                )
            )
        for other in (m for m in modes if m != "async"):
            ratio = medians["async"] / medians[other] if "async" in medians else None
            rows.append(
                Row(
                    "local",
                    f"async / {other}: median time to {accuracy:.2f}",
                    float("nan") if ratio is None else ratio,
                    "x",
                    baseline=medians[other],
                    ratio=ratio,
                    target="< 1",
                    passed=None if ratio is None else ratio < 1,
                )
            )
    return rows


def run_bases(
    names: Sequence[str] | None, modes: Sequence[str], steps: int | None, out: Path | None = None
) -> list[Row]:
    quiet_progress_bars()  # the bootstraps save and load through transformers
    with tempfile.TemporaryDirectory(prefix="tba-bench-local-") as tmp:
        root = out or Path(tmp)
        results: dict[str, dict[str, Points]] = {}
        rows: list[Row] = []
        for name, base in base_models(root, names).items():
            results[name] = {m: run_mode(root / name / m, base, m, steps) for m in modes}
            rows += base_rows(name, results[name])
            print(
                f"{name}: done",
                {m: max(p["accuracy"] for p in r) for m, r in results[name].items()},
            )
        return rows + summary_rows(results)


def run(quick: bool) -> list[Row]:
    if quick:
        return run_bases(["demo"], MODES, steps=300)
    return run_bases(None, MODES, steps=None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bases", help="comma-separated base names (default: all)")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated modes")
    parser.add_argument("--out", type=Path, help="keep the runs in this folder")
    args = parser.parse_args()
    from bench.__main__ import print_table

    names = args.bases.split(",") if args.bases else None
    print_table(run_bases(names, args.modes.split(","), steps=None, out=args.out))


if __name__ == "__main__":
    main()
