"""`make bench`: runs every bench/bench_*.py module's `run(quick)` and prints one table.

`python -m bench --quick` runs reduced sizes; `python -m bench NAME...` runs only those.
"""

from __future__ import annotations

import argparse
import importlib
import json
import pkgutil
import sys
from pathlib import Path

from bench.common import Row


def _fmt(value: float | None) -> str:
    return "" if value is None else f"{value:.4g}"


def print_table(rows: list[Row]) -> None:
    header = ("benchmark", "case", "value", "unit", "baseline", "ratio", "target", "ok")
    lines = [
        (
            r.benchmark,
            r.case,
            _fmt(r.value),
            r.unit,
            _fmt(r.baseline),
            _fmt(r.ratio),
            r.target,
            "" if r.passed is None else ("yes" if r.passed else "NO"),
        )
        for r in rows
    ]
    widths = [max(len(str(x)) for x in col) for col in zip(header, *lines, strict=False)]
    for line in (header, *lines):
        print("  ".join(str(x).ljust(w) for x, w in zip(line, widths, strict=True)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("names", nargs="*", help="benchmark modules to run (default: all)")
    parser.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke run")
    parser.add_argument("--json", type=Path, help="also write the rows as JSON here")
    args = parser.parse_args()
    modules = pkgutil.iter_modules([str(Path(__file__).parent)])
    available = sorted(m.name for m in modules if m.name.startswith("bench_"))
    chosen = [f"bench_{n.removeprefix('bench_')}" for n in args.names] or available
    rows: list[Row] = []
    for name in chosen:
        if name not in available:
            sys.exit(f"no benchmark {name}; have {', '.join(available)}")
        print(f"== {name}", flush=True)
        rows.extend(importlib.import_module(f"bench.{name}").run(quick=args.quick))
    print_table(rows)
    if args.json:
        args.json.write_text(json.dumps([r.__dict__ for r in rows], indent=2))


if __name__ == "__main__":
    main()
