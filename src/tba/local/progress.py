"""The live progress line of `tba local`: step, batch reward, held-out accuracy, weight
version and sample staleness."""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType
from typing import IO, Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from tba.local.evaluator import EvalPoint

# Where the line goes to a file (`make demo > log`), rich would fit it into 80 columns and cut
# the step count and the time; a file has room for the whole line.
FILE_WIDTH_COLUMNS = 160


class ProgressView:
    def __init__(self, total_steps: int, enabled: bool = True, file: IO[str] | None = None) -> None:
        console = Console(file=file)
        if not console.is_terminal:
            console.width = FILE_WIDTH_COLUMNS
        self._progress = Progress(
            TextColumn("step"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.description}"),
            console=console,
            disable=not enabled,
        )
        self._task = self._progress.add_task("starting", total=total_steps)

    def __enter__(self) -> ProgressView:
        self._progress.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._progress.stop()

    def update(self, trainer_rows: Sequence[dict[str, Any]], points: Sequence[EvalPoint]) -> None:
        step, parts = 0, []
        if trainer_rows:
            row = trainer_rows[-1]
            step = int(row["step"])
            parts += [
                f"reward {row.get('trainer/reward_mean', 0.0):.2f}",
                f"version {int(row.get('trainer/version', 0))}",
                f"staleness {row.get('trainer/staleness_mean', 0.0):.1f}",
            ]
        if points:
            parts.insert(1, f"held-out acc {points[-1].accuracy:.3f} (v{points[-1].version})")
        self._progress.update(
            self._task, completed=step, description="  ".join(parts) or "waiting for data"
        )
