"""Settings machinery: pydantic-settings with `TBA_<SECTION>__<FIELD>` env vars, an optional
TOML run config, and overrides from command-line flags (highest priority).

Sections are plain pydantic models (`Section`); each command has a root `CommandSettings`
naming the sections it uses. Only entry points call `load_settings`.
"""

from __future__ import annotations

import contextvars
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import tomli_w
from pydantic import BaseModel, ConfigDict
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

_TOML_FILE: contextvars.ContextVar[Path | None] = contextvars.ContextVar(
    "tba_toml_file", default=None
)

S = TypeVar("S", bound="CommandSettings")


class Section(BaseModel):
    """One `[section]` of a run config; unknown keys are errors, not silently ignored."""

    # Errors name the field but never echo its value: values may be secrets (tokens, keys).
    model_config = ConfigDict(extra="forbid", validate_default=True, hide_input_in_errors=True)


class CommandSettings(BaseSettings):
    """Root settings of one command. Priority: flags > env vars > TOML file > defaults."""

    model_config = SettingsConfigDict(
        env_prefix="TBA_",
        env_nested_delimiter="__",
        extra="forbid",
        nested_model_default_partial_update=True,
        hide_input_in_errors=True,
    )
    env_prefix: ClassVar[str] = "TBA_"

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        toml_file = _TOML_FILE.get()
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        if toml_file is not None:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=toml_file))
        return tuple(sources)

    def to_toml(self) -> str:
        """The resolved settings as a TOML run config (None values left out)."""
        return tomli_w.dumps(drop_none(self.model_dump(mode="json")))


def load_settings(
    cls: type[S], toml_file: Path | None = None, overrides: dict[str, Any] | None = None
) -> S:
    """Builds `cls` from overrides (dotted keys such as `buffer.grpc_port`), env and TOML."""
    if toml_file is not None and not toml_file.is_file():
        raise FileNotFoundError(f"config file {toml_file} does not exist")
    token = _TOML_FILE.set(toml_file)
    try:
        return cls(**nest_dotted(overrides or {}))
    finally:
        _TOML_FILE.reset(token)


def nest_dotted(flat: dict[str, Any]) -> dict[str, Any]:
    """{"a.b": 1, "a.c": 2} -> {"a": {"b": 1, "c": 2}}."""
    nested: dict[str, Any] = {}
    for dotted, value in flat.items():
        *parents, leaf = dotted.split(".")
        node = nested
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return nested


def drop_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: drop_none(v) for k, v in value.items() if v is not None}
    return value
