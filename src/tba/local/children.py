"""The run configs `tba local` hands its child services: each child gets its sections as a
TOML file (secrets stay out of files and go by environment variable)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import tomli_w

from tba.local.config import LocalRunSettings
from tba.settings import drop_none

SECRET_FIELDS = ("access_key_id", "secret_access_key")


def command(*args: str) -> list[str]:
    return [sys.executable, "-m", "tba", *args]


def forks(settings: LocalRunSettings) -> bool:
    """Whether the services are forked from `tba local` (`local.start_method`). `auto` forks
    where the OS can and this process runs torch on one thread: a fork keeps only the thread
    that forked, so a pool of torch threads the parent started would be a broken copy."""
    method = settings.local.start_method
    if method == "auto":
        return hasattr(os, "fork") and settings.local.threads_per_process == 1
    return method == "fork"


def write_config(path: Path, sections: dict[str, Any]) -> Path:
    path.write_text(tomli_w.dumps(drop_none(sections)))
    return path


def secret_env(settings: LocalRunSettings) -> dict[str, str]:
    """The object-store credentials and the buffer's token as the children's environment
    variables."""
    env = {}
    token = settings.buffer.auth_token
    if token is not None:
        env["TBA_BUFFER__AUTH_TOKEN"] = env["TBA_CLIENT__AUTH_TOKEN"] = token.get_secret_value()
    for name in SECRET_FIELDS:
        secret = getattr(settings.objectstore, name)
        if secret is not None:
            env[f"TBA_OBJECTSTORE__{name.upper()}"] = secret.get_secret_value()
    return env


def apply_mode(settings: LocalRunSettings) -> None:
    """`sync`: the on-policy baseline on the same code. The trainer publishes after every step
    (synchronously, before it draws the next batch) and trains only on the newest version's
    completions; each searcher generates one batch per version and waits for the next."""
    if settings.local.mode != "sync":
        return
    trainer, searcher = settings.trainer, settings.searcher
    trainer.publish_every_steps = 1
    trainer.publish_in_background = False  # lockstep: version t+1 holds step t+1's weights
    trainer.recency_probability = 1.0
    trainer.max_age_versions = 0
    trainer.min_batch_prompts = trainer.num_prompts
    # No initial fill: the searchers generate one round per version, so a fill beyond one
    # round would never come before the first step.
    trainer.initial_buffer_completions = 0
    searcher.one_round_per_version = True
    searcher.min_version = 1  # the first version the trainer publishes, before any step
    # Together the searchers generate at least one whole batch per version.
    searcher.prompts_per_round = -(-trainer.num_prompts // settings.local.searchers)


def buffer_config(settings: LocalRunSettings, run_dir: Path) -> Path:
    buffer = _dump(settings.buffer, exclude={"auth_token"})
    return write_config(run_dir / "buffer.toml", {"buffer": buffer})


def trainer_config(settings: LocalRunSettings, run_dir: Path, base: Path, address: str) -> Path:
    sections = {
        "trainer": _dump(settings.trainer),
        "optim": _dump(settings.optim),
        "model": {**_dump(settings.model), "source": str(base)},
        "checkpoint": {"dir": str(run_dir / "checkpoints"), "every_steps": 0, "resume": False},
        "metrics": {"stdout": True, "jsonl_path": str(run_dir / "metrics" / "trainer.jsonl")},
        "objectstore": _objectstore(settings),
        "client": {"address": address},
        "searcher": _dump(settings.searcher),
        "task": _dump(settings.task),
    }
    return write_config(run_dir / "trainer.toml", sections)


def searcher_config(
    settings: LocalRunSettings, run_dir: Path, base: Path, address: str, index: int
) -> Path:
    folder = run_dir / f"searcher-{index}"
    folder.mkdir(parents=True, exist_ok=True)
    searcher = {
        **_dump(settings.searcher),
        "id": f"searcher-{index}",
        "seed": settings.searcher.seed + index,
        "weights_dir": str(folder / "weights"),
    }
    sections = {
        "searcher": searcher,
        "engine": _dump(settings.engine),
        "model": {**_dump(settings.model), "source": str(base)},
        "task": _dump(settings.task),
        "objectstore": _objectstore(settings),
        "client": {"address": address},
    }
    return write_config(folder / "searcher.toml", sections)


def _objectstore(settings: LocalRunSettings) -> dict[str, Any]:
    return _dump(settings.objectstore, exclude=set(SECRET_FIELDS))


def _dump(section: Any, exclude: set[str] | None = None) -> dict[str, Any]:
    dumped: dict[str, Any] = section.model_dump(mode="json", exclude=exclude)
    return dumped
