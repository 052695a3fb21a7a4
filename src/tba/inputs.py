"""Checks of a run's inputs before anything starts: every model a command would load is a
directory that exists or has the shape of a hub id, the task is one the searcher can build,
and its local data source exists. Cheap (no model or data is loaded), so a run with a typo
fails in a second, naming the file and the field, instead of minutes later in a service."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from tba.models.config import ModelSettings
from tba.tasks.config import TaskSettings

# `gpt2`, `openai/gsm8k`, `realtreetune/rho-1b-sft-GSM8K`: what a hub id looks like.
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")
TINY = "tiny"
# Fields of each task section naming a model that the task loads.
TASK_MODELS = {
    "preference": (("reward_model", True), ("gold_reward_model", False)),
    "redteam": (("victim_model", True), ("classifier_model", True)),
}


class InputError(ValueError):
    """A model, task or data source of the settings that cannot be loaded."""


def check_inputs(settings: Any, where: str) -> None:
    """Raises InputError naming `where` (the run file) and the field of the first problem."""
    model = getattr(settings, "model", None)
    if isinstance(model, ModelSettings):
        check_model(model.source, where, "[model] source")
    local = getattr(settings, "local", None)
    if local is not None and getattr(local, "model", None):
        check_model(local.model, where, "[local] model")
    task = getattr(settings, "task", None)
    if isinstance(task, TaskSettings):
        # `tba local` builds the task's models set to `tiny`; a service alone cannot.
        check_task(task, where, tiny_task_models=local is not None)


def check_task(task: TaskSettings, where: str, tiny_task_models: bool = False) -> None:
    from tba.tasks.registry import BUILDERS

    if task.name not in BUILDERS:
        known = ", ".join(sorted(BUILDERS))
        raise InputError(f"{where}: [task] name: unknown task {task.name!r} (tasks: {known})")
    section = getattr(task, task.name, None)
    if section is None:
        return
    source = getattr(section, "source", None)
    if source is not None and looks_like_path(source) and not Path(source).exists():
        raise InputError(
            f"{where}: [task.{task.name}] source: {source!r} does not exist "
            "(a directory of JSONL files, or a hub data set name)"
        )
    for field, required in TASK_MODELS.get(task.name, ()):
        value = getattr(section, field)
        if value is None and required:
            raise InputError(f"{where}: [task.{task.name}] {field}: required by task {task.name}")
        if value == TINY and not tiny_task_models:
            raise InputError(
                f"{where}: [task.{task.name}] {field}: `tiny` task models are built by "
                "`tba local` only; give a model directory or hub id"
            )
        if value is not None:
            check_model(value, where, f"[task.{task.name}] {field}")


def check_model(source: str, where: str, field: str) -> None:
    """A model source is an existing directory, or a hub id (checked when it is loaded)."""
    if Path(source).expanduser().is_dir():
        return
    if looks_like_path(source):
        raise InputError(f"{where}: {field}: model directory {source!r} does not exist")
    if not HUB_ID.fullmatch(source):
        raise InputError(f"{where}: {field}: {source!r} is neither a directory nor a hub id")


def looks_like_path(value: str) -> bool:
    """Absolute, explicitly relative, home-relative, or deeper than a hub id's `org/name`."""
    return value.startswith(("/", ".", "~")) or "\\" in value or value.count("/") > 1
