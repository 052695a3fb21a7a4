"""How a searcher joins the buffer's run (docs/runs.md): it waits until a trainer has
registered one, takes the run's task, model, temperature (and its per-round range) and
completion length wherever its own settings leave them unset, lets the buffer check what it
did set (FAILED_PRECONDITION naming the field), and tags its trajectories with the run's id."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from tba.domain import AddResult, Lease, Trajectory
from tba.models.config import ModelSettings
from tba.runs import Run, RunIdentity, combined, generation_identity
from tba.searcher.config import SearcherRunSettings
from tba.settings import deep_update
from tba.tasks.config import TaskSettings

if TYPE_CHECKING:
    from tba.buffer.transport.grpc_client import BufferClient

log = logging.getLogger(__name__)
# How often a searcher waiting for a run says so.
WAIT_LOG_INTERVAL_S = 30.0


def _adopted(section: BaseModel, run_json: str, include: dict[str, Any]) -> dict[str, Any]:
    adopted: dict[str, Any] = json.loads(run_json)
    deep_update(adopted, section.model_dump(mode="json", include=include))
    return adopted


def adopt_run(settings: SearcherRunSettings, run: Run) -> SearcherRunSettings:
    """The settings this searcher runs with: the run's task, model, temperature and
    completion length, except where its own settings set them."""
    task = TaskSettings.model_validate(
        _adopted(settings.task, run.recipe.task_json, settings.explicit("task"))
    )
    model = ModelSettings.model_validate(
        _adopted(settings.model, run.recipe.model_json, settings.explicit("model"))
    )
    own = settings.explicit("searcher")
    generation = {
        name: getattr(run.identity, name)
        for name in ("temperature", "max_new_tokens")
        if name not in own
    }
    generation |= {
        name: value for name, value in _run_temperature_range(run.identity) if name not in own
    }
    searcher = settings.searcher.model_copy(update=generation)
    return settings.model_copy(update={"task": task, "model": model, "searcher": searcher})


def _run_temperature_range(identity: RunIdentity) -> list[tuple[str, float | None]]:
    """The run's range as searcher settings: bounds of 0 (no range) are unset ones; a run
    without a range leaves the fraction to the searcher's (it then draws nothing)."""
    fraction = identity.temperature_draw_fraction
    return [
        ("temperature_low", identity.temperature_low or None),
        ("temperature_high", identity.temperature_high or None),
        *([("temperature_draw_fraction", fraction)] if fraction else []),
    ]


def settings_identity(settings: SearcherRunSettings) -> RunIdentity:
    """The identity fields known before the model is loaded."""
    s = settings.searcher
    return generation_identity(settings.task, s.temperature, s.max_new_tokens, s.temperature_range)


def model_identity(
    settings: SearcherRunSettings, tokenizer: Any, model_config: Any, base_seed: int
) -> RunIdentity:
    """The whole identity, once the base model is loaded."""
    from tba.models import loading

    model = loading.model_identity(settings.model, base_seed, tokenizer, model_config)
    return combined(model, settings_identity(settings))


def wait_for_run(
    client: BufferClient, searcher_id: str, poll_s: float, stop: threading.Event
) -> Run | None:
    """The buffer's run once a trainer has registered one; None when stopped first."""
    waiting_since_s = time.monotonic()
    next_log_s = waiting_since_s
    while not stop.is_set():
        run = client.join_run(searcher_id, RunIdentity())
        if run is not None:
            return run
        if time.monotonic() >= next_log_s:
            log.info(
                "waiting for a run: no trainer has registered one with the buffer at %s "
                "(%.0f s so far)",
                client.settings.address,
                time.monotonic() - waiting_since_s,
            )
            next_log_s += WAIT_LOG_INTERVAL_S
        stop.wait(poll_s)
    return None


@dataclass
class RunBuffer:
    """The buffer client as a searcher loop sees it: every batch tagged with the run."""

    client: BufferClient
    run_id: str

    def lease_prompts(self, searcher_id: str, max_prompts: int, lease_s: float = 0.0) -> Lease:
        return self.client.lease_prompts(searcher_id, max_prompts, lease_s)

    def add_trajectories(
        self,
        trajectories: Sequence[Trajectory],
        *,
        searcher_id: str,
        request_id: str,
        lease_id: str = "",
    ) -> AddResult:
        return self.client.add_trajectories(
            trajectories,
            searcher_id=searcher_id,
            request_id=request_id,
            lease_id=lease_id,
            run_id=self.run_id,
        )
