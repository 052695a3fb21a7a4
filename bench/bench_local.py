"""Asynchrony against the synchronous baseline on the one-machine demo: `tba local` in `async`
and `--mode sync` from the same cached base model for the same number of trainer steps, each
a whole run of real processes. Reported: wall time (from the services' start) until held-out
greedy accuracy first reaches base + 0.25 and base + 0.10, for each mode, and the ratio
async / sync of those times (below 1: asynchrony is faster). `--quick` runs fewer steps.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.common import Row
from tba.local.bootstrap import bootstrap_base_model
from tba.local.config import BootstrapSettings
from tba.tasks.arithmetic import ArithmeticTask
from tba.tasks.base import Split

MARGINS = (0.25, 0.10)


def _run(run_dir: Path, base: Path, mode: str, steps: int) -> list[dict[str, Any]]:
    cmd = [sys.executable, "-m", "tba", "local", "--run-dir", str(run_dir), "--mode", mode]
    cmd += ["--model", str(base), "--steps", str(steps), "--set", "local.progress=false"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    lines = (run_dir / "eval.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def _seconds_to(points: list[dict[str, Any]], accuracy: float) -> float | None:
    return next((p["wall_s"] for p in points if p["accuracy"] >= accuracy), None)


def _rows(points: dict[str, list[dict[str, Any]]]) -> list[Row]:
    rows = []
    base = points["async"][0]["accuracy"]
    for margin in MARGINS:
        seconds = {mode: _seconds_to(p, base + margin) for mode, p in points.items()}
        for mode, value in seconds.items():
            rows.append(Row("local", f"{mode}: s to base+{margin}", value or float("nan"), "s"))
        fast, slow = seconds["async"], seconds["sync"]
        ratio = fast / slow if fast is not None and slow is not None else None
        rows.append(
            Row(
                "local",
                f"async / sync time to base+{margin}",
                ratio if ratio is not None else float("nan"),
                "x",
                baseline=slow,
                ratio=ratio,
                target="< 1",
                passed=None if ratio is None else ratio < 1,
            )
        )
    for mode, p in points.items():
        rows.append(
            Row("local", f"{mode}: best held-out accuracy", max(x["accuracy"] for x in p), "")
        )
    return rows


def run(quick: bool) -> list[Row]:
    steps = 150 if quick else 600
    with tempfile.TemporaryDirectory(prefix="tba-bench-local-") as tmp:
        root = Path(tmp)
        train = ArithmeticTask().prompts(Split.TRAIN)
        base = bootstrap_base_model(root, BootstrapSettings(), train)
        points = {mode: _run(root / mode, base, mode, steps) for mode in ("async", "sync")}
    return _rows(points)
