"""Task names -> builders. A task is built from `[task]` settings; see `tba.tasks.base.Task`."""

from __future__ import annotations

from collections.abc import Callable

from tba.errors import InvalidArgumentError
from tba.tasks.base import Task
from tba.tasks.config import TaskSettings


def _arithmetic(settings: TaskSettings) -> Task:
    from tba.tasks.arithmetic import ArithmeticTask

    return ArithmeticTask(settings.arithmetic)


def _gsm8k(settings: TaskSettings) -> Task:
    from tba.tasks.gsm8k import Gsm8kTask

    return Gsm8kTask(settings.gsm8k)


def _preference(settings: TaskSettings) -> Task:
    from tba.tasks.preference import PreferenceTask

    return PreferenceTask(settings.preference)


def _redteam(settings: TaskSettings) -> Task:
    from tba.tasks.redteam import RedteamTask

    return RedteamTask(settings.redteam)


BUILDERS: dict[str, Callable[[TaskSettings], Task]] = {
    "arithmetic": _arithmetic,
    "gsm8k": _gsm8k,
    "preference": _preference,
    "redteam": _redteam,
}


def build_task(settings: TaskSettings) -> Task:
    """The task `settings.name` names; InvalidArgumentError lists the known ones."""
    builder = BUILDERS.get(settings.name)
    if builder is None:
        known = ", ".join(sorted(BUILDERS))
        raise InvalidArgumentError(f"unknown task {settings.name!r}; known tasks: {known}")
    return builder(settings)
