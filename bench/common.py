"""What every benchmark returns: rows of measured values beside their baseline."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Row:
    """One measured figure. `ratio` is measured relative to the baseline of the same run,
    oriented as the target states it (e.g. "loop / bare tokens/s >= 0.9")."""

    benchmark: str
    case: str
    value: float
    unit: str
    baseline: float | None = None
    ratio: float | None = None
    target: str = ""
    passed: bool | None = None
