"""How a searcher joins the buffer's run (docs/runs.md): it waits until a trainer has
registered one, takes the run's task, model, temperature and completion length wherever its
own settings leave them unset, lets the buffer check what it did set (FAILED_PRECONDITION
naming the field), and tags its trajectories with the run's id."""

from __future__ import annotations

import contextvars
import json
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, PrivateAttr, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

from tba.domain import AddResult, Lease, Trajectory
from tba.models.config import ModelSettings
from tba.runs import Run, RunIdentity, combined, generation_identity
from tba.tasks.config import TaskSettings

if TYPE_CHECKING:
    from tba.buffer.transport.grpc_client import BufferClient
    from tba.searcher.main import SearcherRunSettings

log = logging.getLogger(__name__)
# How often a searcher waiting for a run says so.
WAIT_LOG_INTERVAL_S = 30.0
# What each construction of a settings class read from its sources (flags, env, file).
_RECORDED: contextvars.ContextVar[list[dict[str, Any]] | None] = contextvars.ContextVar(
    "tba_recorded_settings", default=None
)


class _Recording(PydanticBaseSettingsSource):
    """A settings source that notes what it provides: what the user set, not defaults."""

    def __init__(self, inner: PydanticBaseSettingsSource, into: list[dict[str, Any]]) -> None:
        super().__init__(inner.settings_cls)
        self._inner = inner
        self._into = into

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self._inner.get_field_value(field, field_name)

    def __call__(self) -> dict[str, Any]:
        values = self._inner()
        self._into.append(values)
        return values


class ExplicitSettings(BaseSettings):
    """Root settings that remember which fields the user set (`explicit`), by any source."""

    _explicit: dict[str, Any] | None = PrivateAttr(default=None)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        recorded: list[dict[str, Any]] = []
        _RECORDED.set(recorded)
        chosen = super().settings_customise_sources(
            settings_cls,
            init_settings=init_settings,
            env_settings=env_settings,
            dotenv_settings=dotenv_settings,
            file_secret_settings=file_secret_settings,
        )
        return tuple(_Recording(source, recorded) for source in chosen)

    @model_validator(mode="after")
    def _remember_explicit(self) -> ExplicitSettings:
        recorded = _RECORDED.get()
        _RECORDED.set(None)
        if recorded is not None:
            merged: dict[str, Any] = {}
            for values in reversed(recorded):  # lowest priority first
                _deep_update(merged, values)
            self._explicit = merged
        return self

    def explicit(self, section: str) -> dict[str, Any]:
        """An `include` spec of the section's fields the user set; every field when this
        object was not built from sources (then nothing is known to be a default)."""
        if self._explicit is None:
            return _include_all(getattr(self, section).model_dump())
        return _include_all(self._explicit.get(section, {}))


def _deep_update(into: dict[str, Any], values: dict[str, Any]) -> None:
    for key, value in values.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _deep_update(into[key], value)
        else:
            into[key] = value


def _include_all(values: Any) -> dict[str, Any]:
    if not isinstance(values, dict):
        return {}
    return {k: _include_all(v) if isinstance(v, dict) else True for k, v in values.items()}


def _adopted(section: BaseModel, run_json: str, include: dict[str, Any]) -> dict[str, Any]:
    adopted: dict[str, Any] = json.loads(run_json)
    _deep_update(adopted, section.model_dump(mode="json", include=include))
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
    searcher = settings.searcher.model_copy(update=generation)
    return settings.model_copy(update={"task": task, "model": model, "searcher": searcher})


def settings_identity(settings: SearcherRunSettings) -> RunIdentity:
    """The identity fields known before the model is loaded."""
    s = settings.searcher
    return generation_identity(settings.task, s.temperature, s.max_new_tokens)


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
        searcher_id: str,
        lease_id: str = "",
        request_id: str | None = None,
    ) -> AddResult:
        return self.client.add_trajectories(
            trajectories, searcher_id, lease_id, request_id, run_id=self.run_id
        )
