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
from typing import Any

from pydantic import model_validator

from tba.buffer.config import BufferSettings
from tba.commandline import Flag
from tba.local.config import BootstrapSettings, LocalSettings, demo_sections
from tba.models.config import ModelSettings
from tba.objectstore.config import ObjectStoreSettings
from tba.searcher.config import EngineSettings, SearcherSettings
from tba.settings import CommandSettings
from tba.tasks.config import TaskSettings
from tba.trainer.config import OptimSettings, TrainerSettings

HELP = "Run buffer, trainer and searchers together on this machine (the demo)."
log = logging.getLogger(__name__)


class LocalRunSettings(CommandSettings):
    """The services' own defaults, so that a run file means the same to `tba local` as to
    each service; with no run file, the arithmetic demo's settings (`demo_sections`)."""

    local: LocalSettings = LocalSettings()
    bootstrap: BootstrapSettings = BootstrapSettings()
    task: TaskSettings = TaskSettings()
    trainer: TrainerSettings = TrainerSettings()
    optim: OptimSettings = OptimSettings()
    searcher: SearcherSettings = SearcherSettings()
    engine: EngineSettings = EngineSettings()
    # One machine's buffer, on ports free at the time (the children are told its address).
    buffer: BufferSettings = BufferSettings(grpc_port=0, http_port=0)
    objectstore: ObjectStoreSettings = ObjectStoreSettings()
    model: ModelSettings = ModelSettings()

    @classmethod
    def without_run_file(cls) -> dict[str, Any]:
        return demo_sections()

    @model_validator(mode="after")
    def _run_paths(self) -> LocalRunSettings:
        if "uri" not in self.objectstore.model_fields_set:
            self.objectstore.uri = f"file://{self.local.run_dir}/weights"
        return self


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
