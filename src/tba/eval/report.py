"""How `tba eval` shows its report: a rich table of metrics (and a few samples) on the
terminal, and the whole report as JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tba.eval.suites import EvalReport

SAMPLE_CHARS = 160
COUNT_METRICS = frozenset({"eval/prompts", "eval/samples", "eval/diversity_samples"})


def print_report(report: EvalReport, model: str, show_samples: int) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title=f"tba eval: {report.task} ({report.split} split)", min_width=48)
    table.add_column("metric")
    table.add_column("value", justify="right")
    for name, value in report.metrics.items():
        table.add_row(name, _metric(name, value))
    table.caption = f"model {model}"
    console.print(table)
    if show_samples and report.samples:
        samples = Table(title="samples", show_lines=True)
        fields = list(report.samples[0])
        for name in fields:
            samples.add_column(name, overflow="fold")
        for sample in report.samples[:show_samples]:
            samples.add_row(*(_cell(sample[name]) for name in fields))
        console.print(samples)


def write_report(report: EvalReport, path: Path, extra: dict[str, Any]) -> None:
    """The report as one JSON object (with `extra`, such as the model and settings)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    document = extra | report.to_json()
    path.write_text(json.dumps(document, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _metric(name: str, value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.0f}" if name in COUNT_METRICS else f"{value:.4f}"


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4f}"
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return text if len(text) <= SAMPLE_CHARS else text[: SAMPLE_CHARS - 3] + "..."
