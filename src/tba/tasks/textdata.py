"""Rows of text data sets for tasks: one JSONL file per split in a directory, or a hub dataset
loaded with `datasets` (an optional dependency). Rows are JSON objects; tasks pick fields."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tba.errors import InvalidArgumentError

Row = dict[str, Any]


def load_rows(
    task: str, source: str, split_name: str, limit: int | None, hub_config: str | None = None
) -> list[Row]:
    """The first `limit` rows (all when None) of split `split_name`: `<source>/<split>.jsonl`
    when `source` is a directory, else the hub dataset `source`."""
    directory = Path(source)
    if directory.is_dir():
        return read_jsonl(task, directory / f"{split_name}.jsonl", limit)
    return _load_hub(task, source, split_name, limit, hub_config)


def read_jsonl(task: str, path: Path, limit: int | None) -> list[Row]:
    if not path.is_file():
        raise InvalidArgumentError(f"{task}: {path} is missing")
    rows: list[Row] = []
    with path.open(encoding="utf-8") as lines:
        for line_no, line in enumerate(lines, start=1):
            if limit is not None and len(rows) >= limit:
                break
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                where = f"{path}:{line_no}"
                raise InvalidArgumentError(f"{task}: {where}: not valid JSON ({e.msg})") from e
            if not isinstance(row, dict):
                raise InvalidArgumentError(f"{task}: {path}:{line_no}: a row must be an object")
            rows.append(row)
    return rows


def text_field(task: str, row: Row, field: str, where: str, required: bool = True) -> str:
    """The non-empty string `row[field]`; "" for a missing optional field."""
    value = row.get(field)
    if value is None and not required:
        return ""
    if not isinstance(value, str) or not value.strip():
        raise InvalidArgumentError(f"{task}: {where}: missing or empty string field {field!r}")
    return value


def _load_hub(
    task: str, source: str, split_name: str, limit: int | None, hub_config: str | None
) -> list[Row]:
    try:
        import datasets
    except ImportError as e:
        raise InvalidArgumentError(
            f"{task}: {source!r} is not a directory, and loading it by hub name needs the "
            "`datasets` package (pip install datasets)"
        ) from e
    try:
        rows: Iterable[Any] = datasets.load_dataset(source, hub_config, split=split_name)
        return [dict(row) for row in itertools.islice(rows, limit)]
    except Exception as e:
        raise InvalidArgumentError(
            f"{task}: {source!r} is not a directory, and loading split {split_name!r} from "
            f"the hub failed: {e}"
        ) from e
