"""What every benchmark returns: rows of measured values beside their baseline."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


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


@dataclass(frozen=True)
class ProcStat:
    parent_pid: int
    cpu_s: float  # user + system, all threads


def proc_stat(pid: int) -> ProcStat:
    """A process's parent and CPU seconds so far, from /proc (Linux); OSError once it is gone."""
    # The command name, in parentheses, may hold spaces: fields are counted after it.
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])  # utime, stime
    return ProcStat(int(fields[1]), ticks / os.sysconf("SC_CLK_TCK"))
