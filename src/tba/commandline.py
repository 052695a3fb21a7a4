"""Shared plumbing of `tba` subcommands: config flags, `--config`, `--set`, `--print-config`.

A command module (e.g. `tba.buffer.main`) exposes `FLAGS`, `SETTINGS` and `run(settings)`;
it must import heavy dependencies (torch, vLLM, redis) inside `run`, so that `tba --help`
and images without them still work.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from tba.inputs import InputError, check_inputs
from tba.settings import CommandSettings, RunFileError, Section, describe_error, load_settings

CONFIG_ENV = "TBA_CONFIG"


@dataclass(frozen=True)
class Flag:
    """A command-line flag that sets one settings field (`path` is `section.field`)."""

    name: str
    path: str
    help: str
    is_switch: bool = False


def add_config_arguments(parser: argparse.ArgumentParser, flags: tuple[Flag, ...]) -> None:
    parser.add_argument(
        "--config",
        type=Path,
        help=f"TOML run file: the sections of every command of the run (docs/configuration.md); "
        f"default: the {CONFIG_ENV} environment variable.",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.FIELD=VALUE",
        help="Set any settings field, e.g. --set trainer.lr=1e-5 (repeatable).",
    )
    parser.add_argument(
        "--print-config",
        action="store_true",
        help="Print the resolved settings as TOML and exit.",
    )
    for flag in flags:
        if flag.is_switch:
            parser.add_argument(
                flag.name, dest=_dest(flag), action="store_const", const=True, help=flag.help
            )
        else:
            parser.add_argument(flag.name, dest=_dest(flag), help=flag.help)


def settings_from_args(
    cls: type[CommandSettings],
    args: argparse.Namespace,
    flags: tuple[Flag, ...],
    run_sections: Mapping[str, type[Section]],
    config: Path | None = None,
) -> CommandSettings:
    """Resolves settings from flags, env and the run file `config` (validated against
    `run_sections`, the sections of every command) and checks the run's inputs (models, task,
    data); on any problem exits with a message naming the file and field."""
    overrides = _overrides(args, flags)
    where = str(config) if config is not None else "settings"
    try:
        settings = load_settings(cls, config, overrides, run_sections)
        check_inputs(settings, where)
    except RunFileError as exc:
        sys.exit(f"error: invalid run file:\n{exc}")
    except ValidationError as exc:
        problems = "\n".join(describe_error(error) for error in exc.errors())
        sys.exit(f"error: invalid settings ({where}, env or flags):\n{problems}")
    except InputError as exc:
        sys.exit(f"error: {exc}")
    if args.print_config:
        print(settings.to_toml(), end="")
        sys.exit(0)
    return settings


def _overrides(args: argparse.Namespace, flags: tuple[Flag, ...]) -> dict[str, Any]:
    overrides: dict[str, Any] = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or not key:
            sys.exit(f"error: --set takes SECTION.FIELD=VALUE, got {item!r}")
        overrides[key.strip()] = value
    for flag in flags:
        value = getattr(args, _dest(flag))
        if value is not None:
            overrides[flag.path] = value
    return overrides


def _dest(flag: Flag) -> str:
    return "flag_" + flag.path.replace(".", "__")
