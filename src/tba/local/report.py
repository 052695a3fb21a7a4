"""The end of a `tba local` run: a summary table and a PNG of accuracy and reward against
wall time and steps."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tba.local.evaluator import EvalPoint


@dataclass(frozen=True)
class Summary:
    mode: str
    base_accuracy: float
    final_accuracy: float
    best_accuracy: float
    steps: int
    versions: int
    wall_s: float
    seconds_to: dict[str, float | None]  # threshold label -> first wall time reaching it

    def rows(self) -> list[tuple[str, str]]:
        rows = [
            ("mode", self.mode),
            ("held-out accuracy, base", f"{self.base_accuracy:.3f}"),
            ("held-out accuracy, final", f"{self.final_accuracy:.3f}"),
            ("held-out accuracy, best", f"{self.best_accuracy:.3f}"),
            ("trainer steps", str(self.steps)),
            ("weight versions evaluated", str(self.versions)),
            ("wall time (s)", f"{self.wall_s:.0f}"),
        ]
        for label, seconds in self.seconds_to.items():
            rows.append(
                (f"time to {label} (s)", "not reached" if seconds is None else f"{seconds:.0f}")
            )
        return rows


def first_time_reaching(points: Sequence[EvalPoint], accuracy: float) -> float | None:
    return next((p.wall_s for p in points if p.accuracy >= accuracy), None)


def summarize(mode: str, points: Sequence[EvalPoint], steps: int, wall_s: float) -> Summary:
    base = points[0].accuracy
    thresholds = {"base + 0.25": base + 0.25, "0.80": 0.80, "0.90": 0.90}
    return Summary(
        mode=mode,
        base_accuracy=base,
        final_accuracy=points[-1].accuracy,
        best_accuracy=max(p.accuracy for p in points),
        steps=steps,
        versions=len(points) - 1,
        wall_s=wall_s,
        seconds_to={label: first_time_reaching(points, a) for label, a in thresholds.items()},
    )


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The complete rows of a JSONL file that a process may still be appending to."""
    return JsonlTail(path).read_new()


class JsonlTail:
    """Follows a JSONL file that another process appends to. Each read parses only the lines
    completed since the previous one: following a run costs what it wrote since, not the
    whole file again (thousands of rows, parsed twice a second), and a line caught half
    written (the writer's buffer went out before the line's end) waits for its newline."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0

    def read_new(self) -> list[dict[str, Any]]:
        try:
            with self.path.open("rb") as f:
                f.seek(self._offset)
                written = f.read()
        except FileNotFoundError:
            return []
        complete = written[: written.rfind(b"\n") + 1]
        self._offset += len(complete)
        return [json.loads(line) for line in complete.splitlines() if line.strip()]


def plot(
    points: Sequence[EvalPoint],
    trainer_rows: Sequence[dict[str, Any]],
    started_at_s: float,
    path: Path,
) -> None:
    """Accuracy and mean batch reward against wall time (left) and trainer steps (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_time, by_step) = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
    by_time.plot(
        [p.wall_s for p in points], [p.accuracy for p in points], "o-", label="held-out accuracy"
    )
    by_step.plot(
        [p.step for p in points], [p.accuracy for p in points], "o-", label="held-out accuracy"
    )
    rewards = [r for r in trainer_rows if "trainer/reward_mean" in r]
    if rewards:
        by_time.plot(
            [r["time_s"] - started_at_s for r in rewards],
            [r["trainer/reward_mean"] for r in rewards],
            ".",
            alpha=0.4,
            label="batch reward",
        )
        by_step.plot(
            [r["step"] for r in rewards],
            [r["trainer/reward_mean"] for r in rewards],
            ".",
            alpha=0.4,
            label="batch reward",
        )
    for axis, label in ((by_time, "wall time since start (s)"), (by_step, "trainer step")):
        axis.set_xlabel(label)
        axis.set_ylim(0, 1)
        axis.grid(alpha=0.3)
        axis.legend(loc="lower right")
    fig.suptitle("TBA local run: held-out greedy accuracy and sampled reward")
    fig.savefig(path, dpi=100)
    plt.close(fig)


def print_summary(summary: Summary, run_dir: Path) -> None:
    """The summary as a table on stdout and as JSON in the run directory."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"TBA local run ({run_dir})")
    table.add_column("what")
    table.add_column("value", justify="right")
    for what, value in summary.rows():
        table.add_row(what, value)
    Console().print(table)
    (run_dir / "summary.json").write_text(json.dumps(asdict(summary), indent=2))
    print(f"plot: {run_dir / 'plot.png'}  metrics: {run_dir / 'metrics'}", flush=True)
