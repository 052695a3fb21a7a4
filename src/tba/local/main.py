"""`tba local`: the whole system on one machine, each service its own process.

Buffer service (embedded store by default), one trainer and N searchers start together under
one supervisor and stop together (Ctrl-C included). The base model is `--model`, else
`[model] source`; `tiny` is the committed demo base for arithmetic and a tiny model built from
`[model]` for other tasks (whose task models set to `tiny` are built tiny too). While the run
goes, every new weight version is scored greedily on held-out prompts; at the end come a
summary table, a PNG plot and JSONL metrics in the run directory.
"""

from __future__ import annotations

import logging

from tba.cli import Flag
from tba.local.config import LocalRunSettings
from tba.settings import CommandSettings

HELP = "Run buffer, trainer and searchers together on this machine (the demo)."
log = logging.getLogger(__name__)


SETTINGS = LocalRunSettings
FLAGS = (
    Flag("--run-dir", "local.run_dir", "folder of everything the run writes"),
    Flag("--mode", "local.mode", "`async` (TBA, default) or `sync` (on-policy baseline)"),
    Flag("--searchers", "local.searchers", "searcher processes"),
    Flag("--steps", "trainer.steps", "trainer steps"),
    Flag("--store", "buffer.store", "the buffer's store: `memory` or redis://HOST:PORT/DB"),
    Flag("--objectstore", "objectstore.uri", "where weights go: file://PATH or s3://BUCKET/PREFIX"),
    Flag("--engine", "engine.kind", "searcher engine: `transformers` or `vllm`"),
    Flag("--model", "local.model", "a base model directory (default: [model] source)"),
    Flag("--task", "task.name", "task name (default: arithmetic)"),
    Flag("--objective", "trainer.objective", "`tb` (default) or `rloo`"),
)


def run(settings: CommandSettings) -> None:
    assert isinstance(settings, LocalRunSettings)
    from tba.local.run import LocalRun

    LocalRun(settings).run()
