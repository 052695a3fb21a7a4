"""Settings machinery: pydantic-settings with `TBA_<SECTION>__<FIELD>` env vars, an optional
TOML run file, and overrides from command-line flags (highest priority).

Sections are plain pydantic models (`Section`); each command has a root `CommandSettings`
naming the sections it uses (in its package's config.py). A run file holds the sections of
every command of a run: it is validated against the sections of all of them (`run_sections`),
and each command takes only its own. Only entry points call `load_settings`.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Self, TypeVar

import tomli_w
from pydantic import (
    BaseModel,
    ConfigDict,
    ModelWrapValidatorHandler,
    PrivateAttr,
    ValidationError,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    InitSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

S = TypeVar("S", bound="CommandSettings")
# The key under which `resolve` hands the run file's sections to the sources, next to the
# flags' values: it holds a dot, and `nest_dotted` splits every flag key at its dots, so no
# flag can spell it.
_RUN_FILE_KEY = "run.file"
# The key under which `ExplicitSettings`'s sources hand what they provided to its validator.
_RECORDS_KEY = "recorded.sources"


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
    def without_run_file(cls) -> dict[str, Any]:
        """Sections that stand in for the run file when none is given (below env vars)."""
        return {}

    @classmethod
    def resolve(cls, overrides: dict[str, Any], run_file_sections: dict[str, Any] | None) -> Self:
        """The settings from nested `overrides` (flags), env vars, the run file's sections
        (None: no run file, then `without_run_file()`) and defaults, in that priority."""
        given: dict[str, Any] = {**overrides, _RUN_FILE_KEY: run_file_sections}
        return cls(**given)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        assert isinstance(init_settings, InitSettingsSource)
        file_sections = init_settings.init_kwargs.pop(_RUN_FILE_KEY, None)
        if file_sections is None:
            file_sections = cls.without_run_file()
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        if file_sections:
            sources.append(InitSettingsSource(settings_cls, init_kwargs=file_sections))
        return tuple(sources)

    @classmethod
    def sections(cls) -> dict[str, type[Section]]:
        """Section name -> its model, for the sections this command reads."""
        return {
            name: _section_model(name, info.annotation) for name, info in cls.model_fields.items()
        }

    def to_toml(self) -> str:
        """The resolved settings as a TOML run config (None values left out)."""
        return tomli_w.dumps(drop_none(self.model_dump(mode="json")))


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


class _Records(PydanticBaseSettingsSource):
    """The lowest source: what the recording sources above it provided, for the validator."""

    def __init__(self, settings_cls: type[BaseSettings], records: list[dict[str, Any]]) -> None:
        super().__init__(settings_cls)
        self._records = records

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        return {_RECORDS_KEY: self._records}


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
        records: list[dict[str, Any]] = []
        chosen = super().settings_customise_sources(
            settings_cls,
            init_settings=init_settings,
            env_settings=env_settings,
            dotenv_settings=dotenv_settings,
            file_secret_settings=file_secret_settings,
        )
        recording = (_Recording(source, records) for source in chosen)
        return (*recording, _Records(settings_cls, records))

    @model_validator(mode="wrap")
    @classmethod
    def _remember_explicit(
        cls, data: Any, handler: ModelWrapValidatorHandler[ExplicitSettings]
    ) -> ExplicitSettings:
        records = None
        if isinstance(data, dict) and _RECORDS_KEY in data:
            records = data[_RECORDS_KEY]
            data = {key: value for key, value in data.items() if key != _RECORDS_KEY}
        settings = handler(data)
        if records is not None:
            merged: dict[str, Any] = {}
            for values in reversed(records):  # lowest priority first
                deep_update(merged, values)
            settings._explicit = merged
        return settings

    def explicit(self, section: str) -> dict[str, Any]:
        """An `include` spec of the section's fields the user set; every field when this
        object was not built from sources (then nothing is known to be a default)."""
        if self._explicit is None:
            return _include_all(getattr(self, section).model_dump())
        return _include_all(self._explicit.get(section, {}))


def deep_update(into: dict[str, Any], values: dict[str, Any]) -> None:
    """Merges `values` into `into`, section by section: nested dicts merge, the rest replaces."""
    for key, value in values.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            deep_update(into[key], value)
        else:
            into[key] = value


def _include_all(values: Any) -> dict[str, Any]:
    if not isinstance(values, dict):
        return {}
    return {k: _include_all(v) if isinstance(v, dict) else True for k, v in values.items()}


class RunFileError(ValueError):
    """A run file that cannot be read or does not validate; the message names the file, the
    section and the field (never a value: values may be secrets)."""


def load_settings(
    cls: type[S],
    toml_file: Path | None = None,
    overrides: dict[str, Any] | None = None,
    run_sections: Mapping[str, type[Section]] | None = None,
) -> S:
    """Builds `cls` from overrides (dotted keys such as `buffer.grpc_port`), env and the run
    file. The file is validated against `run_sections` (the sections of every command; by
    default `cls`'s own) and `cls` takes only its own sections from it."""
    file_sections: dict[str, Any] | None = None
    if toml_file is not None:
        data = validate_run_file(toml_file, run_sections or cls.sections())
        file_sections = {name: data[name] for name in cls.model_fields if name in data}
    return cls.resolve(nest_dotted(overrides or {}), file_sections)


def read_run_file(path: Path) -> dict[str, Any]:
    """The run file's TOML; RunFileError when it is missing or not TOML."""
    try:
        with path.open("rb") as stream:
            return tomllib.load(stream)
    except FileNotFoundError as exc:
        raise RunFileError(f"{path}: run file does not exist") from exc
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise RunFileError(f"{path}: cannot read the run file: {exc}") from exc


def validate_run_file(path: Path, sections: Mapping[str, type[Section]]) -> dict[str, Any]:
    """The run file's data after checking every section against `sections`: an unknown
    section, an unknown field or a bad value is a RunFileError listing each one."""
    data = read_run_file(path)
    problems: list[str] = []
    for name, value in data.items():
        model = sections.get(name)
        if model is None:
            known = ", ".join(sorted(sections))
            problems.append(f"{path}: unknown section [{name}] (sections: {known})")
        elif not isinstance(value, dict):
            problems.append(f"{path}: {name} must be a [{name}] section")
        else:
            problems.extend(_section_problems(path, name, model, value))
    if problems:
        raise RunFileError("\n".join(problems))
    return data


def _section_problems(
    path: Path, name: str, model: type[Section], value: dict[str, Any]
) -> list[str]:
    try:
        model.model_validate(value)
    except ValidationError as exc:
        return [f"{path}: {describe_error(error, (name,))}" for error in exc.errors()]
    return []


def describe_error(error: Any, prefix: tuple[str, ...] = ()) -> str:
    """`[section] field: message` of one pydantic error (its input never shown)."""
    loc = [*prefix, *(str(part) for part in error["loc"])]
    message = "unknown field" if error["type"] == "extra_forbidden" else error["msg"]
    if not loc:
        return str(message)
    if len(loc) == 1:
        if error["type"] == "extra_forbidden":
            return f"[{loc[0]}]: unknown section"
        return f"[{loc[0]}]: {message}"
    return f"[{'.'.join(loc[:-1])}] {loc[-1]}: {message}"


def _section_model(name: str, annotation: Any) -> type[Section]:
    if isinstance(annotation, type) and issubclass(annotation, Section):
        return annotation
    raise TypeError(f"settings field {name!r} is not a Section")


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
