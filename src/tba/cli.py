"""The `tba` command: its parser, one subcommand per service (`COMMANDS`), and the flags every
subcommand shares (`--config`, `--set`, `--print-config` and the command's own `FLAGS`).

A command module (e.g. `tba.buffer.main`) exposes `FLAGS`, `SETTINGS`, `HELP`, `SET_EXAMPLE`
and `run(settings)`; it must import heavy dependencies (torch, vLLM, redis) inside `run`, so that
`tba --help` and images without them still work.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from pydantic import ValidationError

from tba.inputs import InputError, check_inputs
from tba.settings import CommandSettings, RunFileError, Section, describe_error, load_settings

CONFIG_ENV = "TBA_CONFIG"
# (group, command) -> module with FLAGS, SETTINGS, HELP, SET_EXAMPLE and run(settings).
COMMANDS: dict[tuple[str, ...], str] = {
    ("buffer", "serve"): "tba.buffer.main",
    ("trainer", "run"): "tba.trainer.main",
    ("searcher", "run"): "tba.searcher.main",
    ("local",): "tba.local.main",
    ("eval",): "tba.eval.main",
}


@dataclass(frozen=True)
class Flag:
    """A command-line flag that sets one settings field (`path` is `section.field`)."""

    name: str
    path: str
    help: str
    # What the value is, as `--help` shows it (`N`, `DIR`, `URL`); switches take none.
    metavar: str | None = None
    is_switch: bool = False


def add_config_arguments(
    parser: argparse.ArgumentParser, flags: tuple[Flag, ...], set_example: str
) -> None:
    parser.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help=f"TOML run file: the sections of every command of the run (docs/configuration.md); "
        f"default: the {CONFIG_ENV} environment variable.",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.FIELD=VALUE",
        help=f"Set any settings field, e.g. --set {set_example} (repeatable).",
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
            parser.add_argument(flag.name, dest=_dest(flag), metavar=flag.metavar, help=flag.help)


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


def build_parser() -> tuple[argparse.ArgumentParser, dict[tuple[str, ...], ModuleType]]:
    parser = argparse.ArgumentParser(prog="tba", description="Trajectory Balance with Asynchrony")
    parser.add_argument(
        "--log-level", default=os.environ.get("TBA_LOG_LEVEL", "INFO"), metavar="LEVEL"
    )
    groups = parser.add_subparsers(dest="group", required=True, metavar="COMMAND")
    modules: dict[tuple[str, ...], ModuleType] = {}
    group_parsers: dict[str, argparse._SubParsersAction[argparse.ArgumentParser]] = {}
    for key, module_name in COMMANDS.items():
        module = importlib.import_module(module_name)
        modules[key] = module
        if len(key) == 1:
            sub = groups.add_parser(key[0], help=module.HELP, description=module.HELP)
        else:
            if key[0] not in group_parsers:
                group = groups.add_parser(key[0], help=f"{key[0]} commands")
                group_parsers[key[0]] = group.add_subparsers(
                    dest="command", required=True, metavar="SUBCOMMAND"
                )
            sub = group_parsers[key[0]].add_parser(
                key[1], help=module.HELP, description=module.HELP
            )
        add_config_arguments(sub, module.FLAGS, module.SET_EXAMPLE)
        sub.set_defaults(command_key=key)
    return parser, modules


def run_sections(
    modules: dict[tuple[str, ...], ModuleType] | None = None,
) -> dict[str, type[Section]]:
    """The sections a run file may hold: the union of every command's sections. A section
    name means one model in every command that reads it."""
    if modules is None:
        modules = {key: importlib.import_module(name) for key, name in COMMANDS.items()}
    union: dict[str, type[Section]] = {}
    for key, module in modules.items():
        for name, model in module.SETTINGS.sections().items():
            if union.setdefault(name, model) is not model:
                raise TypeError(f"section [{name}] of `tba {' '.join(key)}` is another model")
    return union


def main(argv: list[str] | None = None) -> None:
    parser, modules = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    module = modules[args.command_key]
    config = args.config
    if config is None and os.environ.get(CONFIG_ENV):
        config = Path(os.environ[CONFIG_ENV])
    settings = settings_from_args(
        module.SETTINGS, args, module.FLAGS, run_sections(modules), config
    )
    module.run(settings)


if __name__ == "__main__":
    main()
