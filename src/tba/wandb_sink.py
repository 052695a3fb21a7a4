"""Weights & Biases as a metrics sink of the trainer and the searchers (extra `wandb`).

The one module that imports wandb, and only when a sink is built: nothing loads it unless a
`wandb_project` is set. The settings (`WandbSettings`) are shared by the trainer's `[metrics]`
and the searcher's `[searcher]`. Every process of a run logs a wandb run of its own in one
group, the run's id (`tba.runs`), with its resolved settings (secrets left out) as config.
The API key is wandb's own `WANDB_API_KEY` environment variable, never a setting.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, SecretBytes, SecretStr

from tba.settings import Section

# What wandb refuses in a project name.
_PROJECT_PATTERN = r"^[^/\\#?%:]+$"


class WandbSettings(Section):
    """The wandb fields of a section: a project turns the sink on."""

    wandb_project: str | None = Field(
        None,
        min_length=1,
        max_length=128,
        pattern=_PROJECT_PATTERN,
        description="Log metrics to this wandb project (needs the `wandb` extra); unset off.",
    )
    wandb_entity: str | None = Field(
        None,
        min_length=1,
        max_length=128,
        description="wandb user or team owning the project; unset: the API key's default.",
    )
    wandb_mode: Literal["online", "offline", "disabled"] | None = Field(
        None,
        description="`online` (needs WANDB_API_KEY), `offline` (files only, `wandb sync` "
        "later) or `disabled`; unset: wandb's own (WANDB_MODE, else online).",
    )
    wandb_dir: str | None = Field(
        None,
        min_length=1,
        max_length=4096,
        description="Folder of wandb's run files; unset: wandb's own (WANDB_DIR, else ./wandb).",
    )

    @property
    def wandb_on(self) -> bool:
        return self.wandb_project is not None and self.wandb_mode != "disabled"


@dataclass(frozen=True)
class WandbRun:
    """Which process logs: the training run's id (the wandb group), its role (`trainer`,
    `searcher`), its name, and its settings."""

    run_id: str = ""
    job_type: str = ""
    name: str = ""
    config: dict[str, Any] = field(default_factory=dict)


class WandbSink:
    """One wandb run; `write(step, values)` logs the values at that step."""

    def __init__(self, settings: WandbSettings, run: WandbRun) -> None:
        try:
            import wandb
        except ImportError as exc:
            raise RuntimeError(
                f"wandb_project is set ({settings.wandb_project}) but wandb is not installed: "
                "pip install 'tba[wandb]'"
            ) from exc
        if settings.wandb_dir is not None:
            Path(settings.wandb_dir).mkdir(parents=True, exist_ok=True)
        self._run = wandb.init(
            project=settings.wandb_project,
            entity=settings.wandb_entity,
            mode=settings.wandb_mode,
            dir=settings.wandb_dir,
            name=run.name or None,
            group=run.run_id or None,
            job_type=run.job_type or None,
            config=run.config,
            # Trainer and searchers may share a process (tests, notebooks): one run each.
            reinit="create_new",
        )

    def write(self, step: int, values: Mapping[str, float]) -> None:
        self._run.log(dict(values), step=step)

    def close(self) -> None:
        self._run.finish()


def public_config(settings: BaseModel) -> dict[str, Any]:
    """The settings as JSON-ready sections, every secret (token, key) left out."""
    dumped: dict[str, Any] = settings.model_dump(mode="json", exclude=_secrets(settings))
    return dumped


def _secrets(model: BaseModel) -> dict[str, Any]:
    """An `exclude` spec of the fields holding secrets, section by section."""
    found: dict[str, Any] = {}
    for name in type(model).model_fields:
        value = getattr(model, name)
        if isinstance(value, SecretStr | SecretBytes):
            found[name] = True
        elif isinstance(value, BaseModel) and (inner := _secrets(value)):
            found[name] = inner
    return found
