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
# Shown in `--help` as the example of `--set`.
SET_EXAMPLE = "optim.lr=1e-5"
FLAGS = (
    Flag("--run-dir", "local.run_dir", "folder of everything the run writes", metavar="DIR"),
    Flag(
        "--mode",
        "local.mode",
        "`async` (TBA, default) or `sync` (on-policy baseline)",
        metavar="MODE",
    ),
    Flag("--searchers", "local.searchers", "searcher processes", metavar="N"),
    Flag("--steps", "trainer.steps", "trainer steps", metavar="N"),
    Flag(
        "--store",
        "buffer.store",
        "the buffer's store: `memory` or redis://HOST:PORT/DB",
        metavar="URL",
    ),
    Flag(
        "--objectstore",
        "objectstore.uri",
        "where weights go: file://PATH or s3://BUCKET/PREFIX",
        metavar="URI",
    ),
    Flag("--engine", "engine.kind", "searcher engine: `transformers` or `vllm`", metavar="ENGINE"),
    Flag(
        "--model",
        "local.model",
        "a base model directory (default: [model] source)",
        metavar="MODEL",
    ),
    Flag("--task", "task.name", "task name (default: arithmetic)", metavar="TASK"),
    Flag(
        "--objective",
        "trainer.objective",
        "`tb` (default), `rloo`, `grpo` or `online_dpo`",
        metavar="OBJECTIVE",
    ),
)


def run(settings: CommandSettings) -> None:
    assert isinstance(settings, LocalRunSettings)
    from tba.local.run import LocalRun

    LocalRun(settings).run()
