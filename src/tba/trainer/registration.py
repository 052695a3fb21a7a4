"""The trainer registers its run with the buffer (docs/runs.md): the identity every searcher
must agree with, and the recipe searchers build the same task and model from."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tba.runs import Run, RunIdentity, RunRecipe, canonical_json, combined, generation_identity
from tba.trainer.config import TrainerRunSettings

if TYPE_CHECKING:
    from tba.buffer.transport.grpc_client import BufferClient

log = logging.getLogger(__name__)


def run_identity(settings: TrainerRunSettings, tokenizer: Any, model_config: Any) -> RunIdentity:
    from tba.models.loading import model_identity

    generation = settings.searcher
    return combined(
        model_identity(settings.model, settings.trainer.seed, tokenizer, model_config),
        generation_identity(
            settings.task,
            generation.temperature,
            generation.max_new_tokens,
            generation.temperature_range,
        ),
    )


def run_recipe(settings: TrainerRunSettings) -> RunRecipe:
    return RunRecipe(
        task_json=canonical_json(settings.task.model_dump(mode="json")),
        model_json=canonical_json(settings.model.model_dump(mode="json")),
        model_seed=settings.trainer.seed,
    )


def register_run(
    settings: TrainerRunSettings, tokenizer: Any, model_config: Any, client: BufferClient
) -> Run:
    """Registers this trainer's run (the one kept in the checkpoint folder when resuming, else
    a new one); FailedPreconditionError naming what differs when the buffer holds another."""
    from tba.trainer.checkpoint import run_id_for

    checkpoint = settings.checkpoint
    run_id = run_id_for(Path(checkpoint.dir), checkpoint.resume)
    identity = run_identity(settings, tokenizer, model_config)
    run = client.register_run(Run(run_id, identity, run_recipe(settings)))
    log.info("run %s registered with the buffer: %s", run.run_id, run.identity)
    return run
