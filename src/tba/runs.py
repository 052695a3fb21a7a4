"""A run: the one training run a buffer serves, and what every service must agree on.

The trainer registers the run with the buffer; searchers take it from there (so they need
only the buffer's address and token) and tag their trajectories with its id. Which fields
are identity and which are per replica, and what each hash covers, is in docs/runs.md.
This module is pure: the buffer's stores keep runs, transports carry them.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, fields
from typing import Any

from tba.errors import FailedPreconditionError
from tba.tasks.config import TaskSettings

# The task settings that shape a prompt's text, per task: with the task's fixed format
# (arithmetic's `a+b=`), they are its prompt template.
PROMPT_TEMPLATE_FIELDS: dict[str, tuple[str, ...]] = {
    "arithmetic": (),
    "gsm8k": ("template",),
    "preference": ("prompt_field",),
    "redteam": ("instruction", "prompt_field"),
}


@dataclass(frozen=True, slots=True)
class RunIdentity:
    """What must agree across the run's services. An empty string or zero means unknown:
    a searcher that has not loaded its model yet leaves the model's fields out, and fields
    left out are not compared."""

    model_source: str = ""  # a hub name, `tiny`, or `local` for a directory
    model_revision: str = ""  # the hub commit, or `sha256:` of the base weights
    tokenizer_sha256: str = ""
    task_name: str = ""
    prompt_template_sha256: str = ""
    temperature: float = 0.0
    max_new_tokens: int = 0
    # The per-round temperature range and the fraction of rounds drawing from it, all 0 when
    # the run has none: an identity from before the range compares equal to one without.
    temperature_low: float = 0.0
    temperature_high: float = 0.0
    temperature_draw_fraction: float = 0.0


IDENTITY_FIELDS = tuple(f.name for f in fields(RunIdentity))


@dataclass(frozen=True, slots=True)
class RunRecipe:
    """What a searcher needs to build the run's task and model from the buffer alone; per
    replica where it holds paths or devices, so never compared."""

    task_json: str = "{}"  # the `[task]` section
    model_json: str = "{}"  # the `[model]` section
    model_seed: int = 0  # builds the `tiny` base model


@dataclass(frozen=True, slots=True)
class Run:
    run_id: str
    identity: RunIdentity
    recipe: RunRecipe = RunRecipe()
    registered_at_s: float = 0.0


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def prompt_template_sha256(task: TaskSettings) -> str:
    """sha256 of the canonical JSON of the task's name and its prompt-shaping settings
    (`PROMPT_TEMPLATE_FIELDS`): e.g. gsm8k's `template`, redteam's `instruction`."""
    section = getattr(task, task.name, None)
    shaping = {f: getattr(section, f) for f in PROMPT_TEMPLATE_FIELDS.get(task.name, ())}
    return sha256_text(canonical_json({"task": task.name, "prompt": shaping}))


def model_source_kind(source: str, is_directory: bool) -> str:
    """The identity's model source: a directory's path is per replica, its weights are not."""
    return "local" if is_directory else source


def generation_identity(
    task: TaskSettings,
    temperature: float,
    max_new_tokens: int,
    temperature_range: tuple[float, float, float] | None = None,
) -> RunIdentity:
    """The identity fields settings alone give: what is known before loading a model.
    `temperature_range`: the per-round range's low and high and the fraction of rounds that
    draw from it (None: every round at `temperature`)."""
    low, high, fraction = temperature_range or (0.0, 0.0, 0.0)
    return RunIdentity(
        task_name=task.name,
        prompt_template_sha256=prompt_template_sha256(task),
        temperature=temperature,
        max_new_tokens=max_new_tokens,
        temperature_low=low,
        temperature_high=high,
        temperature_draw_fraction=fraction,
    )


def combined(*parts: RunIdentity) -> RunIdentity:
    """One identity from parts that each know some of its fields (later parts win)."""
    values: dict[str, Any] = {}
    for part in parts:
        values.update({n: getattr(part, n) for n in IDENTITY_FIELDS if _known(getattr(part, n))})
    return RunIdentity(**values)


def _known(value: object) -> bool:
    return value not in ("", 0, 0.0)


def differences(registered: RunIdentity, candidate: RunIdentity) -> list[str]:
    """The identity fields the candidate knows and gives another value than the run, each
    as `field: run has A, this has B`; empty when they agree."""
    found = []
    for name in IDENTITY_FIELDS:
        theirs, ours = getattr(registered, name), getattr(candidate, name)
        if _known(ours) and ours != theirs:
            found.append(f"{name}: the run has {theirs!r}, this has {ours!r}")
    return found


def check_joins(registered: Run, candidate: RunIdentity, who: str) -> None:
    """FailedPreconditionError naming each field where `who` contradicts the run."""
    differing = differences(registered.identity, candidate)
    if differing:
        raise FailedPreconditionError(
            f"{who} contradicts the buffer's run {registered.run_id}: {'; '.join(differing)}"
        )


def check_registers(registered: Run, run: Run) -> None:
    """A trainer may register the run the buffer holds again (a resume: same id, same
    identity), nothing else: another run's trajectories never mix with this one's."""
    if registered.run_id != run.run_id:
        differing = differences(registered.identity, run.identity) or ["none (same identity)"]
        raise FailedPreconditionError(
            f"the buffer holds run {registered.run_id}; this trainer's run {run.run_id} is "
            f"another run (differing fields: {'; '.join(differing)}). Resume the buffer's "
            "run from its checkpoint directory, or start the new run on a fresh buffer (an "
            "empty Redis database or another key prefix)"
        )
    check_joins(registered, run.identity, f"trainer resuming run {run.run_id}")


def check_tagged(registered_run_id: str, run_id: str) -> None:
    """Trajectories belong to the registered run (`registered_run_id`, empty while there is
    none); untagged ones, from clients older than runs, only while none is registered."""
    if run_id == registered_run_id:
        return
    if not registered_run_id:
        raise FailedPreconditionError(
            f"trajectories of run {run_id}, but the buffer has no run registered"
        )
    shown = f"run {run_id}" if run_id else "no run (an untagged batch)"
    raise FailedPreconditionError(
        f"trajectories of {shown}, but the buffer serves run {registered_run_id}"
    )
